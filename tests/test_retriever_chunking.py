"""Token-bounded chunking with a whitespace counter and a real Hugging Face tokenizer."""

import pytest

from retrievers.chunking import ChunkingError, chunk_text, token_counter, whitespace_count
from stream2llm.data.corpus import documents_by_id
from retrievers.embedding import model_path


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path()))


@pytest.mark.parametrize("bound", [5, 17, 64])
def test_whitespace_bound_and_no_text_lost(bound):
    text = documents_by_id()["France"].text
    pieces = chunk_text(text, bound, whitespace_count)
    assert all(0 < whitespace_count(p) <= bound for p in pieces)
    assert " ".join(pieces).split() == text.split()


def test_hf_tokenizer_bound(hf_tokenizer):
    count = token_counter(hf_tokenizer)
    text = documents_by_id()["Japan"].text
    pieces = chunk_text(text, 40, count)
    assert len(pieces) > 1 and all(count(p) <= 40 for p in pieces)


def test_giant_word_is_cut():
    pieces = chunk_text("a " + "x" * 50 + " b", 1, len)  # counter: characters
    assert all(len(p) <= 1 for p in pieces) and "".join(pieces).replace(" ", "") == "a" + "x" * 50 + "b"


def test_short_text_is_one_chunk_and_errors():
    assert chunk_text("  hello world ", 10, whitespace_count) == ["hello world"]
    assert chunk_text("   ", 10, whitespace_count) == []
    with pytest.raises(ChunkingError):
        chunk_text("x", 0, whitespace_count)
    with pytest.raises(ChunkingError):
        token_counter(42)
