"""TTFT of streamed vs one-shot prompts on one engine, against the physical floor.

Sessions are shaped like the crawler workload scaled to SmolLM2's context: ~8 chunks of ~800
tokens, ~0.7 s apart; the question comes with the last chunk. For each session we measure
- stream: chunks 1..n-1 handed over as they arrive; TTFT from handing over chunk n + question,
- oneshot: the whole prompt at once (fresh cache salt: no reuse of the streamed KV),
- floor: chunks 1..n-1 already cached, only chunk n + question prefilled, plus one decode step.
Writes bench/results/engine_ttft.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from engine.api import SamplingConfig
from bench.results_meta import engine_dtype, start_run, write_results
from bench.stats import percentile
from engine.config import DEFAULT_MODEL, PLATFORMS, EngineConfig
from engine.measure import run_floor, run_one_shot, run_streamed
from engine.prompt import ContextDoc, RagPrompt
from stream2llm.data.traces import PromptMode
from stream2llm.data.corpus import load_documents

RESULTS = Path(__file__).parent / "results" / "engine_ttft.json"


def pack_chunks(prompt: RagPrompt, docs, num_chunks: int, chunk_tokens: int, start: int):
    """Consecutive summaries packed into chunks of at least `chunk_tokens` tokens."""
    chunks, index = [], start
    for _ in range(num_chunks):
        chunk = prompt.header_ids() if not chunks else []
        while len(chunk) < chunk_tokens:
            doc = docs[index % len(docs)]
            chunk += prompt.doc_ids(ContextDoc(doc.doc_id, doc.title, doc.text))
            index += 1
        chunks.append(chunk)
    return chunks, index


async def bench(args) -> dict:
    from engine.vllm_engine import create_engine

    engine = await create_engine(EngineConfig(model=args.model, max_model_len=8192, dtype=args.dtype,
                                              platform=args.platform, kv_cache_memory_bytes=2 << 30))
    prompt, docs, cursor = RagPrompt(engine.tokenizer), load_documents(), 0
    sampling = SamplingConfig(max_tokens=args.max_tokens)
    rows = []
    try:
        await run_one_shot(engine, engine.tokenize("warm up the engine"), sampling)
        for session in range(args.sessions):
            chunks, cursor = pack_chunks(prompt, docs, args.chunks, args.chunk_tokens, cursor)
            final = chunks[-1] + prompt.footer_ids("Which of these topics is described first?")
            prefix = sum(chunks[:-1], [])
            stream = await run_streamed(engine, chunks[:-1], final, args.gap, sampling)
            oneshot = await run_one_shot(engine, prefix + final, sampling)
            floor = await run_floor(engine, prefix, final, sampling)
            rows.append({"session": session, "prompt_tokens": len(prefix) + len(final),
                         "stream_ttft_s": stream.stats.ttft_s, "oneshot_ttft_s": oneshot.stats.ttft_s,
                         "floor_ttft_s": floor.stats.ttft_s,
                         "identical": stream.answer_ids == oneshot.answer_ids,
                         "floor_identical": floor.answer_ids == oneshot.answer_ids,
                         "stream_answer": stream.answer, "oneshot_answer": oneshot.answer})
            print(f"session {session}: {rows[-1]['prompt_tokens']} tokens  stream {stream.stats.ttft_s:.3f}s  "
                  f"oneshot {oneshot.stats.ttft_s:.3f}s  floor {floor.stats.ttft_s:.3f}s", flush=True)
    finally:
        await engine.shutdown()
    return summarize(rows, args)


def summarize(rows, args) -> dict:
    def block(key):
        values = [r[key] for r in rows]
        return {"ttft_p50_s": percentile(values, 50), "ttft_p95_s": percentile(values, 95)}

    result = {PromptMode.STREAM: block("stream_ttft_s"), PromptMode.ONESHOT: block("oneshot_ttft_s"),
              "floor": block("floor_ttft_s"), "outputs_identical": all(r["identical"] for r in rows),
              "identical_fraction": sum(r["identical"] for r in rows) / len(rows),
              "config": {k: getattr(args, k) for k in ("model", "dtype", "platform", "sessions", "chunks",
                                                        "chunk_tokens", "gap", "max_tokens")},
              "sessions": rows, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    result["speedup_p50"] = result[PromptMode.ONESHOT]["ttft_p50_s"] / result[PromptMode.STREAM]["ttft_p50_s"]
    result["floor_ratio_p50"] = result[PromptMode.STREAM]["ttft_p50_s"] / result["floor"]["ttft_p50_s"]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--chunk-tokens", dest="chunk_tokens", type=int, default=800)
    parser.add_argument("--gap", type=float, default=0.7)
    parser.add_argument("--max-tokens", dest="max_tokens", type=int, default=16)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), help="default: the engine's for this machine")
    parser.add_argument("--platform", default="auto", choices=PLATFORMS, help="cpu, cuda or auto")
    parser.add_argument("--quick", action="store_true", help="3 sessions of 4 chunks of 400 tokens")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.chunks, args.chunk_tokens, args.gap = 3, 4, 400, 0.5
    meta = start_run(args.model, engine_dtype(args.dtype), seeds=[0])
    result = asyncio.run(bench(args))
    write_results(args.out, result, meta)
    print(json.dumps({k: result[k] for k in (*PromptMode, "floor", "speedup_p50",
                                              "floor_ratio_p50", "outputs_identical", "identical_fraction")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
