"""`stream2llm index`: build the FAISS index over the corpus (or a subset) into the cache folder."""

from __future__ import annotations

import argparse
import json
import time

from .vector_index import IndexMissingError, IndexSpec, build_index, index_dir, load_index


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--subset", type=int, default=None, metavar="N",
                        help="index the grounded countries' articles plus N random others (CI); default: all")
    parser.add_argument("--grounded-limit", type=int, default=None,
                        help="with --subset: only the first this many grounded countries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk-tokens", type=int, default=200)
    parser.add_argument("--nlist", type=int, default=None, help="inverted lists (default sqrt(chunks))")
    parser.add_argument("--force", action="store_true", help="rebuild even if the index exists")
    parser.add_argument("--device", default=None, help="torch device for embedding (default cpu)")


def spec_from_args(args: argparse.Namespace) -> IndexSpec:
    return IndexSpec(subset_others=args.subset, grounded_limit=args.grounded_limit, seed=args.seed,
                     chunk_tokens=args.chunk_tokens, nlist=args.nlist)


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    path = index_dir(spec)
    if not args.force:
        try:
            index = load_index(path)
            print(f"index exists: {path} ({index.meta['chunks']} chunks); use --force to rebuild")
            return 0
        except IndexMissingError:
            pass
    from .embedding import Embedder

    start = time.perf_counter()
    index = build_index(spec, path, Embedder(args.device), progress=True)
    print(json.dumps({**index.meta, "path": str(path), "build_s": round(time.perf_counter() - start, 1)}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
