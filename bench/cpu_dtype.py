"""Prefill speed per dtype on this machine, and whether the engine's default dtype is the faster one.

For each dtype, one engine (SmolLM2 by default) prefills the same prompt several times from a cold
cache (fresh cache salt) and decodes one token; the dtypes alternate engine by engine in one run, so
the ratio is measured under one load. Without native bfloat16 (AVX512-BF16 or AMX) PyTorch emulates
it on the CPU, which is why the engine's CPU default is float32 there.

The verdict `default_is_fastest` (the dtype `EngineConfig(dtype=None)` picks here is the fastest
measured, within `--tolerance`) fails the run (exit status 1) when false; `float32_speedup`
(bfloat16 TTFT / float32 TTFT) is the measured ratio.
Writes bench/results/cpu_dtype.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from bench.results_meta import engine_dtype, start_run, write_results
from engine.api import SamplingConfig
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.measure import run_one_shot
from engine.prompt import ContextDoc, RagPrompt
from stream2llm.data.corpus import load_documents

RESULTS = Path(__file__).parent / "results" / "cpu_dtype.json"
DTYPES = ("bfloat16", "float32")


def prompt_ids(engine, tokens: int) -> list[int]:
    """Consecutive corpus summaries in the RAG layout, cut to `tokens` tokens."""
    prompt = RagPrompt(engine.tokenizer)
    ids = prompt.header_ids()
    for doc in load_documents():
        if len(ids) >= tokens:
            break
        ids += prompt.doc_ids(ContextDoc(doc.doc_id, doc.title, doc.text))
    return ids[:tokens]


async def measure(model: str, dtype: str, tokens: int, repeats: int) -> list[float]:
    """Cold-cache one-shot TTFTs (seconds) of a `tokens`-token prompt on a fresh engine in `dtype`."""
    from engine.vllm_engine import create_engine

    engine = await create_engine(EngineConfig(model=model, dtype=dtype, max_model_len=max(2048, tokens + 64),
                                              kv_cache_memory_bytes=512 << 20))
    try:
        ids, first_token = prompt_ids(engine, tokens), SamplingConfig(max_tokens=1)
        await run_one_shot(engine, ids[:64], first_token)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            await run_one_shot(engine, ids, first_token)
            times.append(time.perf_counter() - start)
        return times
    finally:
        await engine.shutdown()


def summarize(times: dict[str, list[float]], tokens: int, default: str, tolerance: float) -> dict:
    per = {d: {"ttft_s": t, "ttft_median_s": statistics.median(t),
               "prefill_tokens_per_s": tokens / statistics.median(t)} for d, t in times.items()}
    fastest = min(per, key=lambda d: per[d]["ttft_median_s"])
    default_ratio = per[default]["ttft_median_s"] / per[fastest]["ttft_median_s"]
    return {"dtypes": per, "prompt_tokens": tokens, "default_dtype": default, "fastest_dtype": fastest,
            "default_vs_fastest": default_ratio, "tolerance": tolerance,
            "default_is_fastest": default_ratio <= 1 + tolerance,
            "float32_speedup": per["bfloat16"]["ttft_median_s"] / per["float32"]["ttft_median_s"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--tokens", type=int, default=1500, help="prompt length")
    parser.add_argument("--repeats", type=int, default=3, help="timed prefills per engine")
    parser.add_argument("--rounds", type=int, default=2, help="engines per dtype, alternating")
    parser.add_argument("--tolerance", type=float, default=0.1, help="default may be this much slower")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    default = engine_dtype(None)
    meta = start_run(args.model, default, seeds=[0])
    times: dict[str, list[float]] = {d: [] for d in DTYPES}
    for _ in range(args.rounds):
        for dtype in DTYPES:
            times[dtype] += asyncio.run(measure(args.model, dtype, args.tokens, args.repeats))
    report = summarize(times, args.tokens, default, args.tolerance)
    report["config"] = {"model": args.model, "tokens": args.tokens, "repeats": args.repeats, "rounds": args.rounds}
    write_results(args.out, report, meta)
    print(json.dumps({k: v for k, v in report.items() if k != "dtypes"}, indent=2))
    return 0 if report["default_is_fastest"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
