"""Ray Serve's default request router: power of two choices over ongoing requests, read from a
per-router cache of queue lengths.

Modelled on Ray 2.60 (`ray/serve/_private/request_router/pow_2_router.py`,
`PowerOfTwoChoicesRequestRouter.choose_replicas`, and `request_router.py`,
`RequestRouter._select_from_candidate_replicas` with `ReplicaQueueLengthCache` from `common.py`):

- two distinct replicas are drawn uniformly at random;
- each one's queue length (its ongoing requests) is read from the router's own cache; an entry is
  missing once older than `RAY_SERVE_QUEUE_LENGTH_CACHE_TIMEOUT_S` (10 s), and an entry at or over
  `max_ongoing_requests` counts as missing too;
- the candidate with the lowest cached length under `max_ongoing_requests` wins; when none has a
  valid entry, the candidates are probed (their true ongoing count) and the cache updated;
- sending a request adds 1 to the chosen replica's entry and refreshes its timestamp
  (`on_send_request`); a finished request subtracts 1 (`decrement_queue_len_cache`).

Each router instance (one per handle: per proxy or per calling replica) keeps its own cache, so a
router learns of the others' requests only when it probes. `routers` sets how many instances share
the traffic (sessions are spread over them in turn). A session is one ongoing request from its
first chunk to its answer (its later chunks follow it: the KV lives there). The FIFO of pending
requests and the back-off when both candidates are full are not modelled: with our
`max_ongoing_requests` (256) no replica fills in these runs; if both do, the less loaded probed one
is taken.
"""

from __future__ import annotations

import random

from scheduler.simulator.routers.base import SessionAsk, Stateless

RAY_QUEUE_LENGTH_CACHE_TIMEOUT_S = 10.0  # ray.serve._private.constants, Ray 2.60


class QueueLengthCache:
    """`ReplicaQueueLengthCache`: replica -> (length, when set); stale entries read as missing."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._entries: dict[int, tuple[int, float]] = {}

    def get(self, replica: int, now: float) -> int | None:
        entry = self._entries.get(replica)
        if entry is None or now - entry[1] > self.timeout_s:
            return None
        return entry[0]

    def update(self, replica: int, length: int, now: float) -> None:
        self._entries[replica] = (length, now)


class Pow2Router(Stateless):
    name = "pow2"

    def __init__(self, seed: int = 0, routers: int = 1, max_ongoing_requests: int = 256,
                 cache_timeout_s: float = RAY_QUEUE_LENGTH_CACHE_TIMEOUT_S, **_settings):
        if routers < 1 or max_ongoing_requests < 1:
            raise ValueError("routers and max_ongoing_requests must be >= 1")
        self._rng = random.Random(seed)
        self.caches = [QueueLengthCache(cache_timeout_s) for _ in range(routers)]
        self.max_ongoing = max_ongoing_requests
        self._turn = 0
        self._sent_by: dict[str, int] = {}  # session -> the router instance that sent it
        self.probes = 0

    def candidates(self) -> list[int]:
        n = len(self.replicas)
        if n == 1:
            return [0]
        i = self._rng.randrange(n)
        j = self._rng.randrange(n - 1)
        return [i, j + (j >= i)]

    def place(self, ask: SessionAsk, now: float) -> int:
        k = self._turn % len(self.caches)
        self._turn += 1
        chosen = self.choose(self.caches[k], self.candidates(), now)
        cache = self.caches[k]
        cache.update(chosen, (cache.get(chosen, now) or 0) + 1, now)  # on_send_request
        self._sent_by[ask.session_id] = k
        return chosen

    def choose(self, cache: QueueLengthCache, candidates: list[int], now: float) -> int:
        best, best_len = None, None
        for r in candidates:
            length = cache.get(r, now)
            if length is not None and length < self.max_ongoing and (best_len is None or length < best_len):
                best, best_len = r, length
        if best is not None:
            return best
        probed = []
        for r in candidates:  # _probe_queue_lens: the replica's true ongoing count
            self.probes += 1
            length = self.replicas[r].num_active
            cache.update(r, length, now)
            probed.append((length, r))
        return min(probed)[1]

    def on_finish(self, session_id: str, replica: int, context_tokens: int, now: float) -> None:
        k = self._sent_by.pop(session_id, None)
        if k is None:
            return
        current = self.caches[k].get(replica, now)
        if current is not None:
            self.caches[k].update(replica, max(0, current - 1), now)
