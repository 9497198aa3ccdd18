"""Tokens of a one-shot prompt from its characters, calibrated by the counts replicas send back.

The ingress admits an OpenAI request before any tokenizer has seen its text, so its KV lease is
sized from the text's length. A fixed characters-per-token guess is far off for most text (3
characters per token is about 2.3x the real count of plain English words with a Llama tokenizer,
and a code or CJK prompt differs the other way), so the estimate is the tokens per character over
the last `window` prompts a replica tokenized (their sums: long prompts, which hold the KV, count
most). A chat template's own tokens are counted with their text, so chat and completions each keep
their own estimate. Until `min_observations` prompts were seen the default ratio stands.
Cost: O(1) per observation and estimate.
"""

from __future__ import annotations

import math
from collections import deque


class PromptTokenEstimate:
    """Estimated tokens of a prompt of `chars` characters (see the module docstring)."""

    def __init__(self, default_chars_per_token: float = 3.0, window: int = 256, min_observations: int = 3):
        if default_chars_per_token <= 0 or window < 1 or min_observations < 1:
            raise ValueError("default_chars_per_token must be > 0, window and min_observations >= 1")
        self.default_tokens_per_char = 1.0 / default_chars_per_token
        self.min_observations = min_observations
        self._recent: deque[tuple[int, int]] = deque(maxlen=window)
        self._chars = 0
        self._tokens = 0

    def observe(self, chars: int, tokens: int) -> None:
        """A replica counted `tokens` tokens in a prompt of `chars` characters."""
        if chars <= 0 or tokens <= 0:
            return
        if len(self._recent) == self._recent.maxlen:
            old_chars, old_tokens = self._recent[0]
            self._chars -= old_chars
            self._tokens -= old_tokens
        self._recent.append((chars, tokens))
        self._chars += chars
        self._tokens += tokens

    @property
    def tokens_per_char(self) -> float:
        if len(self._recent) < self.min_observations:
            return self.default_tokens_per_char
        return self._tokens / self._chars

    def tokens(self, chars: int) -> int:
        return math.ceil(max(chars, 0) * self.tokens_per_char)
