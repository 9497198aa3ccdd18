"""Measured hardware cost model: latency curves fitted from (size, seconds) pairs, stored as JSON.

JSON format (`stream2llm-cost-model/1`):

    {"format": "stream2llm-cost-model/1", "device": "...", "model": "...", "block_size": 16,
     "recompute":   [[tokens, seconds], ...],        # prefill of a prompt of that many tokens
     "decode_step": [[batch, seconds], ...],         # optional: one decode step of that batch
     "swap_out":    [[blocks, seconds], ...] | null, # null where KV offload does not exist (CPU)
     "swap_in":     [[blocks, seconds], ...] | null,
     "prefill_context": [[pairs, seconds], ...] | null, # optional: the extra a prefill pays to attend
                                                        # to context already cached (pairs = new x cached)
     "decode_context":  [[tokens, seconds], ...] | null, # optional: the extra a decode step pays per KV
                                                        # token beyond `decode_base_context` per sequence
     "decode_base_context": 16,                         # the context decode_step was measured at
     "notes": "..."}

Curves are piecewise-linear through the per-size means, made non-decreasing (latency never falls
as the work grows: a dip is timing noise, pooled away by isotonic regression), and extended past
the measured range by the least-squares slope. `stream2llm calibrate` measures recompute on the engine and calls
`build_cost_model`; on CPU there is no swap, and the model says so instead of inventing numbers.

A recompute point is a fresh prompt, so it already holds the prompt's attention to itself; what it
cannot hold is a streamed turn's attention to the context cached by earlier turns, nor a decode's
reads of a long context. On a CPU these are not small (SmolLM2: 128 new tokens cost ~0.06 s alone and
~0.09 s after 512 cached ones), so they are measured as their own curves; a model without them prices
them at zero.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

FORMAT = "stream2llm-cost-model/1"


class CostModelError(ValueError):
    """Malformed measurements or cost-model file."""


class CostModel(Protocol):
    swap_available: bool

    def recompute_s(self, num_tokens: int) -> float: ...

    def swap_out_s(self, num_blocks: int) -> float: ...

    def swap_in_s(self, num_blocks: int) -> float: ...

    def step_s(self, prefill_tokens: int, attention_pairs: float, decode_seqs: int,
               decode_kv_tokens: int, cached_pairs: float = 0.0) -> float:
        """One engine step: prefill tokens + decodes. `attention_pairs` sums, over the prefilled
        requests, new tokens x (cached context + new tokens / 2); `cached_pairs` is the part of it over
        context cached before the step (new tokens x cached tokens); `decode_kv_tokens` sums the
        decoding requests' contexts."""


class Curve:
    """Latency vs size from measurements; never negative."""

    def __init__(self, pairs: Iterable[tuple[float, float]]):
        by_x: dict[float, list[float]] = {}
        for x, y in pairs:
            if x < 0 or y < 0:
                raise CostModelError(f"negative measurement ({x}, {y})")
            by_x.setdefault(float(x), []).append(float(y))
        if not by_x:
            raise CostModelError("a curve needs at least one measurement")
        self.xs = sorted(by_x)
        self.ys = _non_decreasing([sum(by_x[x]) / len(by_x[x]) for x in self.xs],
                                  [len(by_x[x]) for x in self.xs])
        self.slope = _least_squares_slope(self.xs, self.ys)

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x >= xs[-1]:
            return ys[-1] + self.slope * (x - xs[-1])
        if x <= xs[0]:
            return max(0.0, ys[0] - self.slope * (xs[0] - x))
        i = bisect_right(xs, x)
        frac = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + frac * (ys[i] - ys[i - 1])

    def pairs(self) -> list[list[float]]:
        return [[x, y] for x, y in zip(self.xs, self.ys)]


def _non_decreasing(ys: list[float], weights: list[int]) -> list[float]:
    """Pool adjacent violators: the weighted least-squares non-decreasing fit of `ys`."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for y, w in zip(ys, weights):
        blocks.append([y, float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2, c2), (m1, w1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [mean for mean, _, count in blocks for _ in range(count)]


def _least_squares_slope(xs: list[float], ys: list[float]) -> float:
    if len(xs) == 1:
        return ys[0] / xs[0] if xs[0] else 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var)


class MeasuredCostModel:
    def __init__(self, recompute: Curve, decode_step: Curve | None = None,
                 swap_out: Curve | None = None, swap_in: Curve | None = None,
                 block_size: int = 16, device: str = "", model: str = "", notes: str = "",
                 prefill_context: Curve | None = None, decode_context: Curve | None = None,
                 decode_base_context: int = 0):
        if (swap_out is None) != (swap_in is None):
            raise CostModelError("swap needs both swap_out and swap_in measurements, or neither")
        self.recompute, self.decode_step = recompute, decode_step
        self.prefill_context, self.decode_context = prefill_context, decode_context
        self.decode_base_context = decode_base_context
        self.swap_out, self.swap_in = swap_out, swap_in
        self.block_size, self.device, self.model, self.notes = block_size, device, model, notes

    @property
    def swap_available(self) -> bool:
        return self.swap_out is not None

    def recompute_s(self, num_tokens: int) -> float:
        return self.recompute(num_tokens)

    def swap_out_s(self, num_blocks: int) -> float:
        return self._swap(self.swap_out, num_blocks)

    def swap_in_s(self, num_blocks: int) -> float:
        return self._swap(self.swap_in, num_blocks)

    def _swap(self, curve: Curve | None, num_blocks: int) -> float:
        if curve is None:
            raise CostModelError(f"swap is not available on {self.device or 'this device'}")
        return curve(num_blocks)

    def step_s(self, prefill_tokens: int, attention_pairs: float, decode_seqs: int,
               decode_kv_tokens: int, cached_pairs: float = 0.0) -> float:
        seconds = self.recompute(prefill_tokens) if prefill_tokens else 0.0
        if prefill_tokens and cached_pairs > 0 and self.prefill_context is not None:
            seconds += self.prefill_context(cached_pairs)
        if decode_seqs:
            curve = self.decode_step or self.recompute
            seconds += curve(decode_seqs)
            beyond_base = decode_kv_tokens - decode_seqs * self.decode_base_context
            if beyond_base > 0 and self.decode_context is not None:
                seconds += self.decode_context(beyond_base)
        return seconds

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "device": self.device, "model": self.model,
            "block_size": self.block_size, "recompute": self.recompute.pairs(),
            "decode_step": self.decode_step.pairs() if self.decode_step else None,
            "swap_out": self.swap_out.pairs() if self.swap_out else None,
            "swap_in": self.swap_in.pairs() if self.swap_in else None,
            "prefill_context": self.prefill_context.pairs() if self.prefill_context else None,
            "decode_context": self.decode_context.pairs() if self.decode_context else None,
            "decode_base_context": self.decode_base_context,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: dict) -> MeasuredCostModel:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CostModelError(f"not a {FORMAT} document")
        if not data.get("recompute"):
            raise CostModelError("cost model has no recompute measurements")

        def curve(key: str) -> Curve | None:
            pairs = data.get(key)
            try:
                return Curve((float(x), float(y)) for x, y in pairs) if pairs else None
            except (TypeError, ValueError) as exc:
                raise CostModelError(f"bad {key} measurements: {exc}") from exc

        return cls(curve("recompute"), curve("decode_step"), curve("swap_out"), curve("swap_in"),
                   int(data.get("block_size", 16)), str(data.get("device", "")),
                   str(data.get("model", "")), str(data.get("notes", "")),
                   curve("prefill_context"), curve("decode_context"),
                   int(data.get("decode_base_context", 0)))


def build_cost_model(recompute: Iterable[tuple[int, float]], *, block_size: int,
                     device: str, model: str, decode_step: Iterable[tuple[int, float]] = (),
                     swap_out: Iterable[tuple[int, float]] = (),
                     swap_in: Iterable[tuple[int, float]] = (), notes: str = "",
                     prefill_context: Iterable[tuple[float, float]] = (),
                     decode_context: Iterable[tuple[float, float]] = (),
                     decode_base_context: int = 0) -> dict:
    """The JSON document for measured (size, seconds) pairs; what `stream2llm calibrate` writes.
    The context curves are extras over a zero point (no cached context costs nothing extra)."""
    def optional(pairs, anchored: bool = False) -> Curve | None:
        pairs = list(pairs)
        return Curve(([(0.0, 0.0)] if anchored else []) + pairs) if pairs else None

    built = MeasuredCostModel(Curve(recompute), optional(decode_step), optional(swap_out),
                              optional(swap_in), block_size, device, model, notes,
                              optional(prefill_context, True), optional(decode_context, True),
                              decode_base_context)
    return built.to_json()


def save_cost_model(model: MeasuredCostModel | dict, path) -> None:
    data = model.to_json() if isinstance(model, MeasuredCostModel) else model
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def load_cost_model(path) -> MeasuredCostModel:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CostModelError(f"cannot read cost model {path}: {exc}") from exc
    return MeasuredCostModel.from_json(data)
