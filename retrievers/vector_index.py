"""Build, persist and load the FAISS IVF index over corpus chunks.

Layout of an index folder (under ``cache_path("index", spec.name)``): ``index.faiss`` (IVF-Flat,
inner product on normalized MiniLM vectors = cosine), ``vectors.npy`` (for exact-search checks),
``chunks.jsonl`` (one chunk per line: chunk_id, doc_id, title, text) and ``meta.json``.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import faiss
import numpy as np
from tqdm import tqdm

from stream2llm.paths import cache_path

from .chunking import chunk_text
from stream2llm.data.corpus import Document, GroundedQuestion, load_documents, load_grounded_questions

FORMAT_VERSION = 1


class IndexMissingError(FileNotFoundError):
    """No built index at the given folder."""


@dataclass(frozen=True)
class IndexSpec:
    """Which documents to index and how. ``subset_others=None`` indexes the whole corpus; otherwise
    the grounded countries' articles (the first ``grounded_limit`` of them, all when None) plus
    ``subset_others`` random other articles (seeded)."""

    subset_others: int | None = None
    grounded_limit: int | None = None
    seed: int = 0
    chunk_tokens: int = 200   # MiniLM reads at most 256 word pieces; summaries are ~100 (p90 ~160)
    nlist: int | None = None  # None: round(sqrt(number of chunks))

    @property
    def name(self) -> str:
        if self.subset_others is None:
            return f"full-c{self.chunk_tokens}"
        grounded = "all" if self.grounded_limit is None else self.grounded_limit
        return f"subset-g{grounded}-o{self.subset_others}-s{self.seed}-c{self.chunk_tokens}"


@dataclass(frozen=True)
class ChunkMeta:
    chunk_id: str
    doc_id: str
    title: str
    text: str


@dataclass
class VectorIndex:
    index: faiss.IndexIVF
    chunks: list[ChunkMeta]
    vectors: np.ndarray
    meta: dict
    path: Path
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def nlist(self) -> int:
        return self.index.nlist


def select_documents(spec: IndexSpec, documents: Sequence[Document] | None = None,
                     grounded: Sequence[GroundedQuestion] | None = None) -> list[Document]:
    documents = list(documents if documents is not None else load_documents())
    if spec.subset_others is None:
        return documents
    grounded = list(grounded if grounded is not None else load_grounded_questions())[: spec.grounded_limit]
    wanted = {q.doc_id for q in grounded}
    others = [d for d in documents if d.doc_id not in wanted]
    picked = wanted | {d.doc_id for d in random.Random(spec.seed).sample(others, min(spec.subset_others, len(others)))}
    return [d for d in documents if d.doc_id in picked]  # corpus order, so builds are reproducible


def chunk_documents(documents: Sequence[Document], chunk_tokens: int, count_tokens) -> list[ChunkMeta]:
    chunks = []
    for doc in documents:
        for i, piece in enumerate(chunk_text(f"{doc.title}. {doc.text}", chunk_tokens, count_tokens)):
            chunks.append(ChunkMeta(f"{doc.doc_id}#{i}", doc.doc_id, doc.title, piece))
    return chunks


def embed_chunks(embedder, chunks: Sequence[ChunkMeta], batch_size: int = 64, progress: bool = True):
    """Vectors and docs/s; a tqdm bar per batch when ``progress``."""
    start = time.perf_counter()
    parts = []
    for lo in tqdm(range(0, len(chunks), batch_size), desc="embedding", unit="batch", disable=not progress):
        parts.append(embedder.embed([c.text for c in chunks[lo: lo + batch_size]], batch_size=batch_size))
    vectors = np.concatenate(parts) if parts else np.zeros((0, 384), np.float32)
    return vectors, len(chunks) / max(time.perf_counter() - start, 1e-9)


def train_ivf(vectors: np.ndarray, nlist: int | None, seed: int) -> faiss.IndexIVFFlat:
    n, dim = vectors.shape
    nlist = nlist or max(1, round(math.sqrt(n)))
    if not 1 <= nlist <= n:
        raise ValueError(f"nlist must be in 1..{n} (number of chunks), got {nlist}")
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    index.train(vectors)
    index.add(vectors)
    return index


def build_index(spec: IndexSpec, out_dir: Path, embedder, documents=None, grounded=None,
                progress: bool = True) -> VectorIndex:
    docs = select_documents(spec, documents, grounded)
    if not docs:
        raise ValueError("no documents to index")
    chunks = chunk_documents(docs, spec.chunk_tokens, embedder.count_tokens)
    vectors, docs_per_s = embed_chunks(embedder, chunks, progress=progress)
    index = train_ivf(vectors, spec.nlist, spec.seed)
    meta = {"format": FORMAT_VERSION, "spec": asdict(spec), "name": spec.name, "documents": len(docs),
            "chunks": len(chunks), "nlist": index.nlist, "dim": int(vectors.shape[1]),
            "embedding_model": "all-MiniLM-L6-v2", "embed_chunks_per_s": round(docs_per_s, 2),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    _write(out_dir, index, vectors, chunks, meta)
    return VectorIndex(index, chunks, vectors, meta, out_dir)


def _write(out_dir: Path, index, vectors, chunks, meta) -> None:
    """Write into a temporary sibling, then rename: a crash never leaves a half index behind."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    faiss.write_index(index, str(tmp / "index.faiss"))
    np.save(tmp / "vectors.npy", vectors)
    with open(tmp / "chunks.jsonl", "w", encoding="utf-8") as f:
        for c in chunks:
            f.write(json.dumps(asdict(c), ensure_ascii=False) + "\n")
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def load_index(path: Path) -> VectorIndex:
    path = Path(path)
    if not (path / "meta.json").exists():
        raise IndexMissingError(f"no index at {path} (build it with `stream2llm index`)")
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format") != FORMAT_VERSION:
        raise IndexMissingError(f"index at {path} has format {meta.get('format')}, need {FORMAT_VERSION}")
    with open(path / "chunks.jsonl", encoding="utf-8") as f:
        chunks = [ChunkMeta(**json.loads(line)) for line in f]
    return VectorIndex(faiss.read_index(str(path / "index.faiss")), chunks, np.load(path / "vectors.npy"),
                       meta, path)


def index_dir(spec: IndexSpec) -> Path:
    return cache_path("index", spec.name)


def ensure_index(spec: IndexSpec = IndexSpec(), embedder=None, path: Path | None = None,
                 progress: bool = True) -> VectorIndex:
    """Load the index for ``spec``, building it first when missing (the demo's entry point)."""
    path = Path(path) if path is not None else index_dir(spec)
    try:
        return load_index(path)
    except IndexMissingError:
        if embedder is None:
            from .embedding import shared_embedder

            embedder = shared_embedder()
        return build_index(spec, path, embedder, progress=progress)
