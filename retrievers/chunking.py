"""Token-bounded chunking with the engine's tokenizer.

The tokenizer is passed in: either a callable ``count_tokens(text) -> int`` or anything with an
``encode`` method (a Hugging Face tokenizer). Nothing here imports vLLM.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

CountTokens = Callable[[str], int]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n{2,}")


class ChunkingError(ValueError):
    """Bad chunking parameters."""


def whitespace_count(text: str) -> int:
    """A crude counter (one token per whitespace-separated word) for tests and fallbacks."""
    return len(text.split())


def token_counter(tokenizer: Any) -> CountTokens:
    """Turn a callable or a Hugging Face tokenizer into ``count_tokens(text) -> int``."""
    if tokenizer is None:
        return whitespace_count
    if hasattr(tokenizer, "encode"):
        return lambda text: len(tokenizer.encode(text, add_special_tokens=False))
    if callable(tokenizer):
        return tokenizer
    raise ChunkingError(f"need a callable or a tokenizer with .encode, got {type(tokenizer).__name__}")


def chunk_text(text: str, max_tokens: int, count_tokens: CountTokens) -> list[str]:
    """Split ``text`` into pieces of at most ``max_tokens`` tokens, on sentence then word bounds.

    Sentences are packed greedily; the packed piece is re-counted (token counts are not additive
    for BPE), and an over-long sentence is cut on word bounds.
    """
    if max_tokens < 1:
        raise ChunkingError(f"max_tokens must be >= 1, got {max_tokens}")
    text = text.strip()
    if not text:
        return []
    if count_tokens(text) <= max_tokens:
        return [text]
    pieces: list[str] = []
    current = ""
    for sentence in _units(text, max_tokens, count_tokens):
        candidate = f"{current} {sentence}" if current else sentence
        if count_tokens(candidate) <= max_tokens:
            current = candidate
        else:
            if current:
                pieces.append(current)
            current = sentence
    if current:
        pieces.append(current)
    return pieces


def _units(text: str, max_tokens: int, count_tokens: CountTokens) -> list[str]:
    """Sentences, with any sentence longer than the bound cut into word runs that fit."""
    units = []
    for sentence in (s.strip() for s in _SENTENCE_END.split(text)):
        if not sentence:
            continue
        if count_tokens(sentence) <= max_tokens:
            units.append(sentence)
        else:
            units.extend(_split_words(sentence, max_tokens, count_tokens))
    return units


def _split_words(sentence: str, max_tokens: int, count_tokens: CountTokens) -> list[str]:
    out, current = [], ""
    for word in sentence.split():
        candidate = f"{current} {word}" if current else word
        if count_tokens(candidate) <= max_tokens:
            current = candidate
            continue
        if current:
            out.append(current)
        current = word
        if count_tokens(word) > max_tokens:  # one giant "word": cut by characters
            out.extend(_split_chars(word, max_tokens, count_tokens))
            current = ""
    if current:
        out.append(current)
    return out


def _split_chars(word: str, max_tokens: int, count_tokens: CountTokens) -> list[str]:
    out, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start + 1 and count_tokens(word[start:end]) > max_tokens:
            end = start + max(1, (end - start) // 2)
        out.append(word[start:end])
        start = end
    return out
