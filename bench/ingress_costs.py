"""What the ingress did per session in a benchmark cell: its /metrics counters before and after.

- `ingress_cpu_s_per_session`: CPU seconds of the ingress process (Prometheus' process collector on
  the ingress registry) over the cell, per session. Read from whichever ingress replica answers
  /metrics: exact with one ingress replica, as `bench.pipeline` runs.
- `ingress_chunk_bytes_per_session`: context text bytes that passed through the ingress.
- `ray_hops_per_chunk`: Ray hops the text of one context piece made. A piece a replica pulled from
  the retriever actor itself made one (retriever -> replica: the ingress saw a summary); any other
  piece made two (source -> ingress -> replica). From the counted pulls and the context events the
  clients received: (pulled + 2 * (pieces - pulled)) / pieces.
"""

from __future__ import annotations

import httpx

from pipeline.ingress.metrics import INGRESS_CHUNK_BYTES, INGRESS_PROCESS, REPLICA_CONTEXT_CHUNKS

COUNTERS = {"ingress_cpu_s": f"{INGRESS_PROCESS}_process_cpu_seconds_total",
            "ingress_chunk_bytes": f"{INGRESS_CHUNK_BYTES}_total",
            "replica_pulled_chunks": f"{REPLICA_CONTEXT_CHUNKS}_total"}


def read_counters(text: str) -> dict[str, float]:
    """The `COUNTERS` from a Prometheus text exposition (unlabelled samples)."""
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        for key, metric in COUNTERS.items():
            if name == metric:
                values[key] = float(value)
    missing = set(COUNTERS) - set(values)
    if missing:
        raise ValueError(f"/metrics lacks {sorted(COUNTERS[k] for k in missing)}")
    return values


async def scrape(http: httpx.AsyncClient, base: str) -> dict[str, float]:
    response = await http.get(f"{base}/metrics", timeout=30)
    response.raise_for_status()
    return read_counters(response.text)


def per_session(before: dict[str, float], after: dict[str, float], requests: list[dict]) -> dict:
    sessions = len(requests)
    pieces = sum(r.get("contexts") or 0 for r in requests)
    delta = {k: after[k] - before[k] for k in COUNTERS}
    pulled = delta["replica_pulled_chunks"]
    return {
        "sessions": sessions, "context_pieces": pieces, "replica_pulled_chunks": int(pulled),
        "ingress_cpu_s_per_session": round(delta["ingress_cpu_s"] / sessions, 4) if sessions else None,
        "ingress_chunk_bytes_per_session": round(delta["ingress_chunk_bytes"] / sessions, 1) if sessions else None,
        "ray_hops_per_chunk": round((pulled + 2 * (pieces - pulled)) / pieces, 3) if pieces else None,
    }
