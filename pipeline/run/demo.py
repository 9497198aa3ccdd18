"""`stream2llm demo`, the main job: grounded questions through the whole Ray Serve pipeline.

Set-up (with progress bars): the FAISS subset index (built once into the cache, then loaded), then
local Ray + the Serve app on embedded defaults. Each question is then asked over HTTP `/v1/rag`
from two sources, the crawler (search on the local corpus site, pages arriving ~0.7 s apart) and
the progressive vector search, each once streamed and once one-shot, one request at a time so the
TTFTs do not disturb each other. Prints answers, citations and TTFTs, then a closing table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import threading
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from engine.config import DEFAULT_MODEL
from pipeline.run import demo_report
from pipeline.config import AppConfig
from pipeline.run.local import free_port, local_app
from pipeline.run.rag_client import RagResult, ask
from stream2llm.data.corpus import WIKI_ATTRIBUTION, GroundedQuestion, load_grounded_questions
from stream2llm.data.traces import PromptMode

DEFAULT_COUNTRIES = ("France", "Japan", "Kenya", "Peru", "Egypt", "Canada", "Brazil", "India")
MODES = tuple(PromptMode)
STARTUP_STAGES = ("Ray", "Serve deploy", "replicas ready", "warm-up")


class DemoError(RuntimeError):
    """Bad demo options (unknown country, ...)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help='"smollm2" (answers correctly) or "tiny" (gibberish, fast)')
    parser.add_argument("--index-subset", type=int, default=400, metavar="N",
                        help="vector index: all grounded countries' articles + N random others (cached)")
    parser.add_argument("--index-grounded", type=int, default=None, metavar="N",
                        help="only the first N grounded countries in the index (and as questions)")
    parser.add_argument("--countries", nargs="+", default=None, help=f"default: {' '.join(DEFAULT_COUNTRIES[:4])}")
    parser.add_argument("--questions", type=int, default=None, help="how many questions (default: 4, or all --countries)")
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length limit")
    parser.add_argument("--crawler-pages", type=int, default=8, help="pages one crawl fetches at most")
    parser.add_argument("--site-latency-scale", type=float, default=1.0,
                        help="local site page latency multiplier (1: crawler-like, ~0.7 s per page)")
    parser.add_argument("--out", default=None, help="write the table rows as JSON here")


def check_options(args: argparse.Namespace) -> None:
    """Fail before anything slow starts."""
    lowest = {"questions": 1, "max_tokens": 1, "crawler_pages": 1, "index_subset": 0, "index_grounded": 1,
              "site_latency_scale": 0}
    for name, low in lowest.items():
        value = getattr(args, name)
        if value is not None and value < low:
            raise DemoError(f"--{name.replace('_', '-')} must be at least {low}, got {value}")


def pick_questions(countries: list[str] | None, count: int | None, grounded_limit: int | None) -> list[GroundedQuestion]:
    pool = {q.country.casefold(): q for q in load_grounded_questions()[:grounded_limit]}
    if countries:
        unknown = [c for c in countries if c.casefold() not in pool]
        if unknown:
            examples = ", ".join(sorted(q.country for q in pool.values())[:10])
            raise DemoError(f"no grounded question for {', '.join(unknown)}; e.g. {examples}")
        return [pool[c.casefold()] for c in countries][:count]
    # Well-known countries first when the index holds them; then the rest in corpus order.
    preferred = [pool[c.casefold()] for c in DEFAULT_COUNTRIES if c.casefold() in pool]
    return (preferred + [q for q in pool.values() if q not in preferred])[:count or 4]


def build_index(subset: int, grounded_limit: int | None) -> Path:
    from retrievers.vector_index import IndexSpec, ensure_index, index_dir

    spec = IndexSpec(subset_others=subset, grounded_limit=grounded_limit)
    cached = (index_dir(spec) / "meta.json").exists()
    print(f"[1/2] vector index {spec.name}: {'loading from cache' if cached else 'building (once; cached after)'}",
          flush=True)
    started = time.perf_counter()
    index = ensure_index(spec, progress=True)  # tqdm bar over embedding batches when it builds
    print(f"      {index.meta['documents']} articles, {index.meta['chunks']} chunks, "
          f"{time.perf_counter() - started:.1f} s  ({index.path})", flush=True)
    return index.path


def app_config(args: argparse.Namespace, index_path: Path) -> AppConfig:
    """Embedded defaults (CPU, local corpus site) with the demo's model and index."""
    return AppConfig.model_validate({
        "model": {"model": args.model},
        "retrievers": {"vector_index": str(index_path), "crawler_max_pages": args.crawler_pages,
                       "site_latency_scale": args.site_latency_scale},
    })


def _healthz(base: str) -> dict | None:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        r = httpx.get(f"{base}/healthz", timeout=2)
        if r.status_code == 200:
            return r.json()
    return None


def _watch_startup(base: str, bar: tqdm, done: threading.Event) -> None:
    """local_app blocks while it starts: watch its effects from outside to move the stage bar."""
    import ray

    checks = (ray.is_initialized, lambda: _healthz(base) is not None,
              lambda: (_healthz(base) or {}).get("replicas", 0) >= 1)
    for stage, check in zip(STARTUP_STAGES, checks):
        bar.set_postfix_str(stage)
        while not done.is_set() and not check():
            done.wait(0.5)
            bar.refresh()  # keeps the elapsed time ticking
        if done.is_set():
            return
        bar.update(1)


def _quiet_ray_logs() -> None:
    """Ray and Serve log INFO lines to the console (set up when imported): they would break the bar."""
    from ray import serve  # noqa: F401  (configures the "ray.serve" logger)

    for name in ("ray", "ray.serve"):
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def _interrupt_sets(event: threading.Event):
    """Ctrl-C or SIGTERM: stop the stage bar (if still starting) and say why the teardown takes a while."""
    def handler(_signum, _frame):
        event.set()
        print("\ninterrupted: shutting down Ray and Serve ...", flush=True)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def started_app(config: AppConfig):
    """local_app with a stage progress bar; the warm-up requests are its last stage."""
    _quiet_ray_logs()
    port = free_port()
    done = threading.Event()
    bar = tqdm(total=len(STARTUP_STAGES), desc="[2/2] starting app", unit="stage",
               bar_format="{desc}: {n}/{total} stages |{bar}| {elapsed}{postfix}")
    watcher = threading.Thread(target=_watch_startup, args=(f"http://127.0.0.1:{port}", bar, done), daemon=True)
    watcher.start()
    try:
        with _interrupt_sets(done), local_app(config, port=port) as base:
            # ray.init put Ray's C++ crash handler on SIGTERM (it aborts, leaving workers): take it back.
            signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
            _finish_startup(base, bar, done, watcher)
            yield base
    finally:
        done.set()
        bar.close()


def _finish_startup(base: str, bar: tqdm, done: threading.Event, watcher: threading.Thread) -> None:
    done.set()
    watcher.join()
    bar.n = len(STARTUP_STAGES) - 1
    bar.set_postfix_str("warm-up")
    asyncio.run(warm_up(base))
    bar.update(1)
    bar.set_postfix_str("ready")
    bar.close()


WARM_UP = ((PromptMode.STREAM, {"type": "documents", "documents": ["Warm-up."]}),
           (PromptMode.ONESHOT, {"type": "documents", "documents": ["Warm-up."]}),
           (PromptMode.STREAM, {"type": "crawl", "seed_urls": ["/wiki/Earth"]}),  # starts the site and crawler actors
           (PromptMode.STREAM, {"type": "vector", "query": "warm-up"}))             # loads the index and embedder


async def warm_up(base: str) -> None:
    """First calls pay for actor start-up and model loading: keep that out of the measured requests."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as http:
        for mode, source in WARM_UP:
            result = await ask(http, base, "Warm-up.", source, prompt_mode=mode, max_tokens=1)
            if not result.ok:
                raise RuntimeError(f"warm-up request ({source['type']}) failed: {result.status} {result.error}")


def sources_for(question: GroundedQuestion) -> list[tuple[str, dict]]:
    return [("crawler", {"type": "search", "query": question.country}), ("vector", {"type": "vector"})]


async def ask_all(base: str, questions: list[GroundedQuestion], max_tokens: int) -> list[dict]:
    """Sequential on purpose: a request running alongside would slow the other's prefill."""
    rows = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as http:
        for number, question in enumerate(questions, 1):
            for source_name, source in sources_for(question):
                results: dict[str, RagResult] = {}
                for mode in MODES:
                    results[mode] = await ask(http, base, question.question, source,
                                              prompt_mode=mode, max_tokens=max_tokens)
                row = demo_report.make_row(question, source_name, source, results)
                demo_report.print_answer(number, row)
                rows.append(row)
    return rows


def run_demo(args: argparse.Namespace) -> list[dict]:
    """The whole job; returns the table rows. Everything started here is stopped on every path."""
    check_options(args)
    questions = pick_questions(args.countries, args.questions, args.index_grounded)
    index_path = build_index(args.index_subset, args.index_grounded)
    config = app_config(args, index_path)
    started = time.perf_counter()
    try:
        with started_app(config) as base:
            ready = time.perf_counter()
            rows = asyncio.run(ask_all(base, questions, args.max_tokens))
            answered = time.perf_counter()
    finally:
        _shutdown_ray()
    print(f"\n{len(rows) * len(MODES)} requests in {answered - ready:.1f} s (app start {ready - started:.1f} s, "
          f"shutdown {time.perf_counter() - answered:.1f} s)", flush=True)
    return rows


def _shutdown_ray() -> None:
    """local_app tears down once its body ran; this also covers an interrupt inside ray.init."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def run(args: argparse.Namespace) -> int:
    try:
        rows = run_demo(args)
    except DemoError as e:
        print(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        print("interrupted: Ray and Serve are shut down", flush=True)
        return 130
    demo_report.print_table(rows)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        print(f"rows written to {args.out}")
    print(f"\n{WIKI_ATTRIBUTION}")
    failed = demo_report.failed_requests(rows)
    if failed:
        print(f"{failed} request(s) failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stream2llm demo", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
