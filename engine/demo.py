"""`stream2llm demo`: stream Wikipedia summaries into SmolLM2, answer, and compare TTFT.

For each question the country's summary is streamed among a few others (as a crawler would find
them, ~0.7 s apart); the answer is printed with its TTFT, then the same prompt is run one-shot.
"""

from __future__ import annotations

import argparse
import asyncio
import random

from engine.api import SamplingConfig
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.measure import run_one_shot, run_streamed
from engine.prompt import ContextDoc, RagPrompt
from stream2llm.data.corpus import WIKI_ATTRIBUTION, documents_by_id, load_grounded_questions

DEFAULT_COUNTRIES = ["France", "Japan", "Kenya", "Peru"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--countries", nargs="*", default=DEFAULT_COUNTRIES)
    parser.add_argument("--docs", type=int, default=6, help="summaries streamed per question")
    parser.add_argument("--gap", type=float, default=0.7, help="seconds between chunks")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--seed", type=int, default=0)


def context_for(question, num_docs: int, rng: random.Random) -> list[ContextDoc]:
    """The country's summary at a random position among other countries' summaries."""
    docs = documents_by_id()
    others = [q.doc_id for q in load_grounded_questions() if q.doc_id != question.doc_id]
    chosen = rng.sample(others, num_docs - 1)
    chosen.insert(rng.randrange(num_docs), question.doc_id)
    return [ContextDoc(d, docs[d].title, docs[d].text) for d in chosen]


async def demo(args: argparse.Namespace) -> int:
    from engine.vllm_engine import create_engine

    questions = {q.country: q for q in load_grounded_questions()}
    unknown = [c for c in args.countries if c not in questions]
    if unknown:
        raise SystemExit(f"no grounded question for {unknown}; try e.g. {sorted(questions)[:8]}")
    print(f"starting vLLM ({args.model}) on CPU ...", flush=True)
    engine = await create_engine(EngineConfig(model=args.model, max_model_len=8192,
                                              kv_cache_memory_bytes=512 << 20))
    prompt, rng, rows = RagPrompt(engine.tokenizer), random.Random(args.seed), []
    sampling = SamplingConfig(max_tokens=48)
    try:
        for country in args.countries:
            question = questions[country]
            docs = context_for(question, args.docs, rng)
            chunks = [prompt.header_ids() + prompt.doc_ids(docs[0])] + [prompt.doc_ids(d) for d in docs[1:]]
            final = prompt.footer_ids(question.question)
            streamed = await run_streamed(engine, chunks, final, args.gap, sampling)
            one_shot = await run_one_shot(engine, prompt.prompt_ids(docs, question.question), sampling)
            print(f"\nQ: {question.question}  (sources: {', '.join(d.source_id for d in docs)})")
            print(f"A: {streamed.answer.strip()}")
            rows.append((country, question.answered_by(streamed.answer), streamed.stats.context_tokens,
                         streamed.stats.ttft_s, one_shot.stats.ttft_s, streamed.answer_ids == one_shot.answer_ids))
    finally:
        await engine.shutdown()
    _print_table(rows)
    print(f"\n{WIKI_ATTRIBUTION}")
    return 0


def _print_table(rows) -> None:
    print(f"\n{'country':<12}{'correct':>8}{'tokens':>8}{'TTFT stream':>13}{'TTFT one-shot':>15}{'speedup':>9}{'same':>6}")
    for country, correct, tokens, stream, one_shot, same in rows:
        print(f"{country:<12}{_yes(correct):>8}{tokens:>8}{stream * 1000:>11.0f}ms{one_shot * 1000:>13.0f}ms"
              f"{one_shot / stream:>8.1f}x{_yes(same):>6}")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def run(args: argparse.Namespace) -> int:
    return asyncio.run(demo(args))
