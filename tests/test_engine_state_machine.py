"""Property-based test of the engine's session state machine (hypothesis, real vLLM on CPU).

Hypothesis drives random sequences of open, append, replace, finish (read all, read part, drop the
reader), abort and concurrent pairs of those, on one session and across sessions, against the tiny
model with a KV cache small enough that the scheduler evicts. A model of each session's context
predicts every outcome. Invariants after every step: an error is one of the engine's typed errors
and the one the model predicts; a finished answer equals the one-shot greedy answer of the session's
final context; nothing takes longer than `STEP_DEADLINE_S`. After each example: KV blocks, vLLM
requests, running and waiting slots and open sessions are back to baseline.

CI runs a bounded, derandomized budget. A longer random run:
    STREAM2LLM_STATEFUL_EXAMPLES=300 scripts/test.sh tests/test_engine_state_machine.py
"""

from __future__ import annotations

import asyncio
import gc
import os
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, initialize, precondition, rule,
                                 run_state_machine_as_test)

from engine.api import ContextTooLongError, EngineError, SessionNotFoundError, SessionStateError
from tests.lifecycle_harness import (ANSWER_BUDGET, GREEDY, MAX_MODEL_LEN, PIECES, QUESTION, engine_on_thread,  # noqa: F401 - fixture
                                     read_answer, settled)

pytestmark = pytest.mark.timeout(1500)

EXAMPLES = int(os.environ.get("STREAM2LLM_STATEFUL_EXAMPLES", "40"))
STEPS = int(os.environ.get("STREAM2LLM_STATEFUL_STEPS", "25"))


class SessionMachine(RuleBasedStateMachine):
    engine = None
    runner = None
    one_shot_cache: dict = {}
    outcomes: dict = {}
    calls = 0  # engine calls made over the whole run (reported, to show the budget did something)

    sessions = Bundle("sessions")

    def __init__(self):
        super().__init__()
        # The model: context of every open session, in the order opened. Session ids are random,
        # so every choice the model makes goes by opening order and an ordinal label: hypothesis
        # replays an example only if its draws never depend on the ids.
        self.open: dict[str, list[int]] = {}
        self.labels: dict[str, str] = {}
        self.steps: list[str] = []  # (session, operation) of each call, for a failure report

    # ---- helpers ------------------------------------------------------------------------
    def run(self, coro):
        SessionMachine.calls += 1
        try:
            return self.runner.run(coro)
        except AssertionError as hang:  # hypothesis may fail to replay a hang: say what led to it
            print(f"state machine failure: {hang}; steps of this example: {self.steps}")
            raise AssertionError(f"{hang}; steps of this example: {self.steps}") from None

    def new_session(self) -> str:
        sid = self.run(self.engine.open_session())
        self.open[sid] = []
        self.labels[sid] = f"s{len(self.labels):03d}"
        return sid

    def tokens(self, pieces, sid: str) -> list[int]:
        """The pieces' tokens, each tagged with its session: no prefix is shared between sessions
        (the prefix cache would otherwise hold one copy for all and the cache never runs short)."""
        return sum((self.engine.tokenize(f"[{self.labels[sid]}] {PIECES[p]}") for p in pieces), [])

    def expected_answer(self, context: list[int]) -> list[int]:
        key = tuple(context)
        if key not in self.one_shot_cache:
            deltas = self.engine.generate(token_ids=context + self.engine.tokenize(QUESTION), sampling=GREEDY,
                                          cache_salt=uuid.uuid4().hex)
            self.one_shot_cache[key] = self.run(read_answer(deltas))[0]
        return self.one_shot_cache[key]

    def predict(self, sid: str, op: str, ids: list[int] | None = None):
        """The error class the model expects (None: success) and the context after the call."""
        if sid not in self.open:
            return SessionNotFoundError, None
        context = self.open[sid]
        if op == "append" and len(context) + len(ids) > MAX_MODEL_LEN - ANSWER_BUDGET:
            return ContextTooLongError, context
        if op == "replace" and len(ids) > MAX_MODEL_LEN - ANSWER_BUDGET:
            return ContextTooLongError, context
        if op == "finish" and len(context) + len(self.engine.tokenize(QUESTION)) + GREEDY.max_tokens > MAX_MODEL_LEN:
            return ContextTooLongError, context
        return None, {"append": lambda: context + ids, "replace": lambda: ids}.get(op, lambda: None)()

    def check(self, outcome, expected_error):
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, EngineError), f"untyped error {outcome!r}"
            assert expected_error is not None and isinstance(outcome, expected_error), \
                f"got {outcome!r}, the model expected {expected_error}"
        else:
            assert expected_error is None, f"succeeded, the model expected {expected_error.__name__}"

    def call(self, sid: str, op: str, ids=None, read: str = "all"):
        """One operation as a coroutine returning its outcome (an exception is returned, not raised)."""
        engine = self.engine
        self.steps.append(f"{op}({self.labels[sid]}, {len(ids) if ids else ''}{read if op == 'finish' else ''})")

        async def go():
            try:
                if op == "append":
                    return await engine.append(sid, token_ids=ids)
                if op == "replace":
                    return await engine.replace(sid, token_ids=ids)
                if op == "abort":
                    return await engine.abort(sid)
                deltas = engine.finish(sid, question=QUESTION, sampling=GREEDY)
                if read == "drop":
                    del deltas  # the reader goes away without reading
                    gc.collect()
                    for _ in range(3):  # the collected stream's close runs on this loop: let it start
                        await asyncio.sleep(0)
                    return None
                return await read_answer(deltas, limit=1 if read == "part" else None)
            except Exception as error:  # noqa: BLE001 - the outcome is checked against the model
                return error
        return go()

    def apply(self, sid: str, op: str, outcome, ids=None, read="all", racing_abort=False):
        try:
            self._apply(sid, op, outcome, ids, read, racing_abort)
        except AssertionError as failure:  # a failure that does not replay (a race) would be lost
            print(f"state machine failure: {failure}; steps of this example: {self.steps}")
            raise

    def _apply(self, sid, op, outcome, ids, read, racing_abort):
        expected_error, context = self.predict(sid, op, ids)
        key = f"{op}:{getattr(expected_error, '__name__', 'ok')}"
        SessionMachine.outcomes[key] = SessionMachine.outcomes.get(key, 0) + 1
        self.check(outcome, expected_error)
        if expected_error is not None:
            return
        if op in ("abort", "finish"):
            closed_context = self.open.pop(sid)
            if op == "finish" and read == "all":
                answer, reason = outcome
                expected = self.expected_answer(closed_context)
                if racing_abort:  # cut short by the abort that came after it, or done before it
                    assert answer == expected[:len(answer)] and reason in ("abort", "length", "stop")
                else:
                    assert answer == expected, f"answer {answer} != one-shot {expected}"
        else:
            self.open[sid] = context

    # ---- rules --------------------------------------------------------------------------
    @initialize(target=sessions)
    def first_session(self):
        return self.open_session(4)

    @rule(target=sessions, piece=st.none() | st.integers(2, len(PIECES) - 1))
    def open_session(self, piece=None):
        """A new session, most with a first chunk of 120-370 tokens: two or three such sessions
        fill the 20-block cache, so the scheduler has to evict."""
        sid = self.new_session()
        if piece is not None:
            self.append(sid, piece)
        return sid

    # Rules on any session seen so far (closed ones included: their errors are part of the contract),
    # and the same operations on a session the model knows is open, so that contexts grow and the
    # KV cache runs short.
    @precondition(lambda self: self.open)
    @rule(data=st.data(), piece=st.integers(0, len(PIECES) - 1))
    def append_open(self, data, piece):
        self.append(data.draw(st.sampled_from(list(self.open))), piece)

    @precondition(lambda self: self.open)
    @rule(data=st.data(), pieces=st.lists(st.integers(0, len(PIECES) - 1), max_size=3))
    def replace_open(self, data, pieces):
        self.replace(data.draw(st.sampled_from(list(self.open))), pieces)

    @precondition(lambda self: self.open)
    @rule(data=st.data(), read=st.sampled_from(["all", "part", "drop"]))
    def finish_open(self, data, read):
        self.finish(data.draw(st.sampled_from(list(self.open))), read)

    def append(self, sid, piece):
        ids = self.tokens([piece], sid)
        self.apply(sid, "append", self.run(self.call(sid, "append", ids)), ids)

    def replace(self, sid, pieces):
        ids = self.tokens(pieces, sid)
        self.apply(sid, "replace", self.run(self.call(sid, "replace", ids)), ids)

    def finish(self, sid, read):
        self.apply(sid, "finish", self.run(self.call(sid, "finish", read=read)), read=read)

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def abort_open(self, data):
        sid = data.draw(st.sampled_from(list(self.open)))
        self.apply(sid, "abort", self.run(self.call(sid, "abort")))

    @rule(target=sessions)
    def squeeze(self):
        """Deterministic pressure amid the random steps: the open sessions end, a session of 13
        blocks is prefilled and left idle, then one of 15 blocks finishes (20 in the cache): the
        idle one is evicted (TailGuard ranks idle streams last), then finishes too, recomputing.
        Both answers must equal their one-shot answers."""
        for sid in list(self.open):
            self.apply(sid, "abort", self.run(self.call(sid, "abort")))
        idle = self.new_session()
        self.append(idle, 5)
        self.run(self.engine.wait_prefilled(idle))
        asks = self.new_session()
        self.append(asks, 5)
        self.append(asks, 1)
        self.finish(asks, "all")
        self.finish(idle, "all")
        return idle

    @rule(sid=sessions, op=st.sampled_from(["append", "replace", "finish", "abort"]),
          piece=st.integers(0, len(PIECES) - 1), read=st.sampled_from(["all", "part", "drop"]))
    def any_session(self, sid, op, piece, read):
        """Any operation on any session seen so far, closed ones included."""
        ids = self.tokens([piece], sid) if op in ("append", "replace") else None
        self.apply(sid, op, self.run(self.call(sid, op, ids, read)), ids, read)

    @rule(first=sessions, second=sessions, ops=st.tuples(
        st.sampled_from(["append", "replace", "finish", "abort"]), st.sampled_from(["append", "replace", "finish", "abort"])),
        pieces=st.tuples(st.integers(0, len(PIECES) - 1), st.integers(0, len(PIECES) - 1)))
    def concurrent_pair(self, first, second, ops, pieces):
        """Two calls at once, on one session or two: they apply in call order, as the API promises.
        The second call on a session the first is finishing meets it mid-answer: input is refused
        (SessionStateError) and an abort cuts the answer short."""
        ids = [self.tokens([p] if op != "replace" else [p, p], sid) for op, p, sid in zip(ops, pieces, (first, second))]

        async def both():
            return await asyncio.gather(self.call(first, ops[0], ids[0]), self.call(second, ops[1], ids[1]))

        outcomes = self.run(both())
        mid_answer = first == second and ops[0] == "finish" and self.predict(first, "finish")[0] is None
        self.apply(first, ops[0], outcomes[0], ids[0], racing_abort=mid_answer and ops[1] == "abort")
        if mid_answer:
            self.check(outcomes[1], None if ops[1] == "abort" else SessionStateError)
        else:
            self.apply(second, ops[1], outcomes[1], ids[1])

    def teardown(self):
        for sid in list(self.open):
            self.run(self.engine.abort(sid))
        self.run(settled(self.engine))


def test_session_state_machine_under_random_use(engine_on_thread):
    SessionMachine.engine, SessionMachine.runner = engine_on_thread
    run_state_machine_as_test(SessionMachine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
        derandomize=os.environ.get("STREAM2LLM_STATEFUL_RANDOM") is None, suppress_health_check=list(HealthCheck), print_blob=True))
    engine, runner = engine_on_thread
    stats = runner.run(engine.stats())
    print(f"{EXAMPLES} examples: {SessionMachine.calls} engine calls, {stats.preemptions} preemptions or "
          f"evictions, {len(SessionMachine.one_shot_cache)} distinct final contexts answered; outcomes {SessionMachine.outcomes}")
    assert stats.preemptions > 0, "the KV cache never ran short: the examples did not exercise eviction"
