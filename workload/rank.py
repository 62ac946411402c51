"""One rank of the emulated data-parallel job as a state machine over its host's events.

Per step: a compute phase that carries tensor- and pipeline-parallel traffic
(never forgivable) and lasts at least `compute_s` (a timer), a ring
all-reduce of the gradient (reduce-scatter, then all-gather) in which a rank
forwards a chunk only once the chunk it depends on is settled, by arrival or
forgiveness, then a barrier among all ranks. The detector classifies step s+1
before the barrier of step s is sent, so each step's loss budget exists
before any rank can send that step's gradients.

Every delivered byte is checked against the content its sender generated:
non-gradient messages must match exactly; a gradient chunk may differ only in
zero-filled bytes, no more of them than the receiver says it forgave.

Like the endpoint below it, a `Rank` owns no socket and reads no clock: the
driver passes `now` to `start`, `handle_event` and `handle_timer`, and asks
`get_timer` when the rank next needs it. A flow that fails, or a step whose
accounting the host finds wrong, ends the run at once with `failure` set.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import IO, Any, Final

from common import records
from host_agent import events
from host_agent.core import (
    AccordionDetector,
    CriticalRegimeDetector,
    Misclassifying,
)
from host_agent.endpoint import Endpoint
from host_agent.events import BoundViolation, Event, FlowFailed, RecvDone, SendDone, Shed
from workload.lossrecord import Layout, entry_from_completion, may_lose
from workload.plan import (
    Kind,
    Message,
    StepPlan,
    TrainingConfig,
    flow_step,
    plan_step,
    synthetic_norms,
)
from workload.plan import message_bytes as content_of

LINGER_S: Final = 0.2
"""How long a finished rank keeps acknowledging, in case a peer's last ACK was lost."""
_CHECK_BLOCK: Final = 4096

Token = tuple[str, int]
"""Something a rank waits for: ("recv", flow), ("send", flow) or ("compute", step)."""


class _Wait:
    """Something to run once every token it needs is settled; a rank makes one per ring
    message (plain, not a dataclass: common.native)."""

    def __init__(self, order: int, needs: set[Token], then: Callable[[float], None]) -> None:
        self.order = order
        """When it was made: ready waits run in this order."""
        self.needs = needs
        self.then = then
        self.missing = 0
        """How many of `needs` are not settled."""
        self.done = False


def make_detector(cfg: TrainingConfig) -> CriticalRegimeDetector:
    detector: CriticalRegimeDetector = (
        AccordionDetector() if cfg.detector == "accordion" else cfg.schedule()
    )
    if cfg.misclassify:
        return Misclassifying(detector, frozenset(cfg.misclassify))
    return detector


def classify(detector: CriticalRegimeDetector, norms: list[float], step: int) -> bool:
    """Classify `step` before its gradients flow, from the norm of the step before it."""
    return bool(detector.classify(step, norms[step - 2] if step >= 2 else None))


def gradient_mismatch(payload: bytes, expected: bytes) -> tuple[int, int]:
    """(bytes that differ, of those the ones that are not zero-filled), compared block-wise."""
    differ = nonzero = 0
    zeros = bytes(_CHECK_BLOCK)
    for lo in range(0, len(expected), _CHECK_BLOCK):
        got = payload[lo : lo + _CHECK_BLOCK]
        want = expected[lo : lo + _CHECK_BLOCK]
        if got == want:
            continue
        if got == zeros[: len(got)]:
            differ += len(want) - want.count(0)  # a forgiven segment, zero-filled
        else:
            for a, b in zip(got, want, strict=True):
                if a != b:
                    differ += 1
                    nonzero += a != 0
    return differ, nonzero


class Rank:
    """One rank's training loop; the module docstring has the schedule."""

    def __init__(
        self,
        cfg: TrainingConfig,
        endpoint: Endpoint,
        out: IO[str],
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self._warn = warn or (lambda message: None)
        self.endpoint = endpoint
        self.out = out
        self.detector = make_detector(cfg)
        self.norms = synthetic_norms(cfg)
        self.plans: dict[int, StepPlan] = {}
        self.messages: dict[int, Message] = {}
        self.received: dict[int, RecvDone | Shed] = {}
        self.sent: dict[int, SendDone | Shed] = {}
        self.settled: set[Token] = set()
        self._waiting: dict[Token, dict[int, _Wait]] = {}
        """Per token, the waits not yet run that need it (settled or not)."""
        self._ready: dict[int, _Wait] = {}
        """Waits not yet run whose needs are all settled."""
        self._wait_order = itertools.count()
        self.critical: dict[int, bool] = {}
        self.marks: dict[str, float] = {}
        self.totals: Counter = Counter()
        self.finished = False
        self.trained = False
        """Training is over: its last step done (TRAIN_DONE recorded) or the rank failed;
        `finished` follows once the rank has lingered (LINGER_S)."""
        self.steps_done = 0
        """The last step this rank has finished (its barrier passed)."""
        self.failure: str | None = None
        """Why the run failed, in one line; None while it has not."""
        self.started = 0.0
        self._timers: list[tuple[float, int, Callable[[float], None]]] = []
        self._timer_order = itertools.count()
        self.bursts: list[Message] = []
        """Burst messages of forgotten steps: the run's end still waits for them."""
        self.forgotten_below = 0
        """Steps below this one are forgotten (`_forget`)."""
        self.on_sent: Callable[[Message, float], None] | None = None
        """Called with each gradient message this rank has sent whole (its last ACK in) under
        the 'sender-ack' completion: how an engine that sees both ends tells the receiving
        rank (`peer_acked`), as ASTRA-sim's frontend does."""

    # ----- the driver's interface ----------------------------------------------------

    def start(self, now: float) -> None:
        """Register step 1 and the start-up barrier, then wait for every rank to be up."""
        self.started = now
        self._record(records.LOSS_LAYOUT, **Layout.of(self.cfg).to_json())
        self._classify_and_begin(1, now)
        barrier = self._plan(0)
        for msg in barrier.barrier_recvs:
            self._expect(msg, 0, now)
        for msg in barrier.barrier_sends:
            self._send(msg, 0, now)
        self._when(_recvs(barrier.barrier_recvs), lambda t: self._start_step(1, t), now)

    def handle_event(self, event: Event, now: float) -> None:
        if self.finished:
            return
        if (
            isinstance(event, RecvDone | SendDone | Shed)
            and flow_step(event.flow) < self.forgotten_below
            and event.flow not in self.messages
        ):
            return  # a late completion of a forgotten step's flow: nothing waits on it
        if isinstance(event, RecvDone):
            self._check_content(event)
            self._record_loss(event)
            # Checked, the bytes are no longer needed: keep the record, not the payload, so
            # a rank's memory does not grow with every step it has run.
            self.received[event.flow] = replace(event, payload=None)
            self._settle(("recv", event.flow), now)
        elif isinstance(event, SendDone):
            self.sent[event.flow] = event
            self._tell_sent(event.flow, now)
            self._settle(("send", event.flow), now)
        elif isinstance(event, Shed):
            (self.sent if event.sending else self.received)[event.flow] = event
            if event.sending:
                # a shed message is done at its sender at once: no last ACK will follow, and
                # under 'sender-ack' its receiver waits on this instead
                self._tell_sent(event.flow, now)
            else:
                self._record_loss(event)
            self._settle(("send" if event.sending else "recv", event.flow), now)
        elif isinstance(event, FlowFailed):
            self._fail(f"flow {event.flow} to {event.dst} failed: {event.reason}", now)
        elif isinstance(event, BoundViolation):
            # Counted and reported by the host already; it fails the run at its end.
            self.totals["bound_violations"] += 1

    def get_timer(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def handle_timer(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now and not self.finished:
            _, _, fn = heapq.heappop(self._timers)
            fn(now)

    @property
    def failed(self) -> bool:
        return self.failure is not None or bool(
            self.totals["content_errors"] or self.totals["bound_violations"]
        )

    # ----- bookkeeping ---------------------------------------------------------------

    def _call_at(self, when: float, fn: Callable[[float], None]) -> None:
        heapq.heappush(self._timers, (when, next(self._timer_order), fn))

    def _plan(self, step: int) -> StepPlan:
        plan = self.plans.get(step)
        if plan is None:
            plan = self.plans[step] = plan_step(self.cfg, step)
        return plan

    def _record(self, kind: str, **fields: Any) -> None:
        record = {records.TYPE: kind, "rank": self.cfg.rank, **fields}
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    # Each wait counts its needs not yet settled and is indexed by every token it needs, so
    # settling a token touches only the waits that need it: a rank of the 64-rank ring
    # keeps 126 waits at once, which every settle used to scan whole.

    def _when(self, needs: Iterable[Token], then: Callable[[float], None], now: float) -> None:
        w = _Wait(next(self._wait_order), set(needs), then)
        for token in w.needs:
            self._waiting.setdefault(token, {})[w.order] = w
            if token not in self.settled:
                w.missing += 1
        if not w.missing:
            self._ready[w.order] = w
        self._fire_waits(now)

    def _settle(self, token: Token, now: float) -> None:
        if token not in self.settled:
            self.settled.add(token)
            for w in self._waiting.get(token, {}).values():
                w.missing -= 1
                if not w.missing:
                    self._ready[w.order] = w
        self._fire_waits(now)

    def _unsettle(self, tokens: Iterable[Token]) -> None:
        """Forget settled tokens: a wait that needs one is no longer ready."""
        for token in tokens:
            if token in self.settled:
                self.settled.discard(token)
                for w in self._waiting.get(token, {}).values():
                    if not w.missing:
                        self._ready.pop(w.order, None)
                    w.missing += 1

    def _fire_waits(self, now: float) -> None:
        """Run every wait whose needs are settled, in the order they were made; those that
        become ready meanwhile (a wait's action settles a token) run after them."""
        while not self.finished and self._ready:
            ready = [self._ready[order] for order in sorted(self._ready)]
            for w in ready:
                if w.done:
                    continue  # run already by an earlier wait's action
                w.done = True
                self._ready.pop(w.order, None)
                for token in w.needs:
                    waiting = self._waiting[token]
                    del waiting[w.order]
                    if not waiting:
                        del self._waiting[token]
                w.then(now)

    def _send(self, msg: Message, step: int, now: float) -> None:
        self.messages[msg.flow] = msg
        self.endpoint.send(
            self.cfg.ranks[msg.dst],
            msg.flow,
            content_of(self.cfg, msg),
            msg.traffic_class,
            now,
            step,
        )

    def _expect(self, msg: Message, step: int, now: float) -> None:
        self.messages[msg.flow] = msg
        self.endpoint.register_flow(
            msg.flow, step, msg.traffic_class, now, deliver=True, size=msg.size
        )

    def _record_loss(self, event: RecvDone | Shed) -> None:
        """The loss record's entry for a gradient flow that gave up bytes (workload.lossrecord).
        Other flows have none: their event is not turned into its record for nothing."""
        msg = self.messages.get(event.flow)
        if not may_lose(msg):
            return
        entry = entry_from_completion(self.cfg, msg, events.record(event))
        if entry is not None:
            self._record(records.LOSS, **entry.to_json())

    def _check_content(self, event: RecvDone) -> None:
        msg = self.messages.get(event.flow)
        if msg is None:
            return
        payload = event.payload
        # As bytes: comparing bytes with a memoryview goes byte by byte, 60 times slower.
        expected = bytes(content_of(self.cfg, msg))
        if payload == expected:
            return
        if payload is None or len(payload) != len(expected):
            got = None if payload is None else len(payload)
            problem = f"flow {msg.flow}: {got} bytes delivered, {len(expected)} sent"
        elif msg.kind != Kind.GRADIENT:
            problem = f"flow {msg.flow} ({msg.traffic_class}): content differs"
        else:
            differ, nonzero = gradient_mismatch(payload, expected)
            forgiven = event.forgiven_bytes
            if nonzero == 0 and differ <= forgiven:
                return
            problem = (
                f"gradient flow {msg.flow}: {differ} bytes differ ({nonzero} not zero-filled),"
                f" {forgiven} forgiven"
            )
        self.totals["content_errors"] += 1
        self._warn(f"CONTENT ERROR at rank {self.cfg.rank}: {problem}")
        self._record(records.CONTENT_ERROR, flow=msg.flow, problem=problem)

    def _fail(self, reason: str, now: float) -> None:
        if self.failure is None:
            self.failure = reason
            self._record(records.TRAIN_FAILED, reason=reason, time=now - self.started)
        self.trained = self.finished = True

    # ----- the training loop ---------------------------------------------------------

    def _classify_and_begin(self, step: int, now: float) -> None:
        critical = classify(self.detector, self.norms, step)
        self.critical[step] = critical
        self.endpoint.begin_step(step, critical, self._plan(step).expected_gradient_bytes, now)
        for msg in self._plan(step).registrations():
            self._expect(msg, step, now)

    def _start_step(self, step: int, now: float) -> None:
        plan = self._plan(step)
        self.marks = {"start": now}
        for msg in plan.compute_sends:
            self._send(msg, step, now)
        self._call_at(now + self.cfg.compute_s, lambda t: self._settle(("compute", step), t))
        needs = [*_recvs(plan.compute_recvs), *_sends(plan.compute_sends), ("compute", step)]
        if self.cfg.tp_phase == "overlap":
            self._when(needs, lambda t: self._settle(("compute-done", step), t), now)
            self._start_allreduce(step, now)
        else:
            self._when(needs, lambda t: self._start_allreduce(step, t), now)

    def _start_allreduce(self, step: int, now: float) -> None:
        """The ring, part by part (TrainingConfig.splits): within a part a rank forwards a
        message once the one before it in the ring is received; part k starts once part
        k - active_splits is done here (every message of it sent and received)."""
        plan = self._plan(step)
        self.marks["allreduce"] = now
        for msg in plan.burst_sends:
            self._send(msg, step, now)
        cfg = self.cfg
        phases = 2 * (len(cfg.ranks) - 1)
        received = self._received
        parts = [
            (
                plan.gradient_sends[k * phases : (k + 1) * phases],
                plan.gradient_recvs[k * phases : (k + 1) * phases],
            )
            for k in range(cfg.splits)
        ]
        for k, (sends, recvs) in enumerate(parts):
            if k < cfg.active_splits:
                self._send(sends[0], step, now)
            else:
                before_sends, before_recvs = parts[k - cfg.active_splits]
                self._when(
                    [*received(before_recvs), *_sends(before_sends)],
                    partial(self._send, sends[0], step),
                    now,
                )
            for prev, nxt in zip(recvs, sends[1:], strict=False):
                self._when(received([prev]), partial(self._forward, prev, nxt, step), now)
        needs = [*received(plan.gradient_recvs), *_sends(plan.gradient_sends)]
        if cfg.tp_phase == "overlap":
            needs.append(("compute-done", step))
        self._when(needs, lambda t: self._allreduce_done(step, t), now)

    def _forward(self, prev: Message, nxt: Message, step: int, now: float) -> None:
        """Send the ring's next message once the one before it is in: at once, or after
        reducing it into this rank's chunk (TrainingConfig.reduce_bytes_per_s) where it was a
        reduce-scatter message."""
        rate = self.cfg.reduce_bytes_per_s
        if rate and prev.phase < len(self.cfg.ranks) - 1:
            self._call_at(now + 3 * prev.size / rate, partial(self._send, nxt, step))
        else:
            self._send(nxt, step, now)

    def _received(self, msgs: Iterable[Message]) -> list[Token]:
        """What a ring message's receipt waits for: its bytes here, and under the
        'sender-ack' completion its sender's last ACK too (`peer_acked`)."""
        msgs = list(msgs)
        tokens = _recvs(msgs)
        if self.cfg.completion == "sender-ack":
            tokens += [("acked", m.flow) for m in msgs]
        return tokens

    def _tell_sent(self, flow: int, now: float) -> None:
        """A gradient message of this rank's is done at its sender (`on_sent`)."""
        if self.on_sent is not None:
            msg = self.messages.get(flow)
            if msg is not None and msg.kind == Kind.GRADIENT:
                self.on_sent(msg, now)

    def peer_acked(self, flow: int, now: float) -> None:
        """The sender of `flow`, a ring message to this rank, has the ACK of its last byte:
        told by an engine that sees both ends (the simulator), for the 'sender-ack'
        completion. One for a step already forgotten is ignored."""
        if self.finished or flow_step(flow) < self.forgotten_below:
            return
        self._settle(("acked", flow), now)

    def _allreduce_done(self, step: int, now: float) -> None:
        self.marks["barrier"] = now
        self.endpoint.complete_step(step, now)
        if step < self.cfg.steps:
            self._classify_and_begin(step + 1, now)
        plan = self._plan(step)
        for msg in plan.barrier_sends:
            self._send(msg, step, now)
        self._when(_recvs(plan.barrier_recvs), lambda t: self._step_done(step, t), now)

    def _step_done(self, step: int, now: float) -> None:
        plan = self._plan(step)
        state = self.endpoint.step_state(step)
        shed = sum(
            e.bytes or 0
            for e in (self.received[m.flow] for m in plan.gradient_recvs)
            if isinstance(e, Shed)
        )
        shed_sent = sum(
            e.bytes or 0
            for e in (self.sent[m.flow] for m in plan.gradient_sends)
            if isinstance(e, Shed)
        )
        retx = sum(
            e.retransmitted_bytes
            for e in (self.sent[m.flow] for m in plan.gradient_sends)
            if isinstance(e, SendDone)
        )
        self.totals["expected"] += plan.expected_gradient_bytes
        self.totals["forgiven"] += state.forgiven
        self.totals["shed"] += shed
        self.totals["shed_sent"] += shed_sent
        self.totals["retransmitted"] += retx
        self._record(
            records.TRAIN_STEP,
            step=step,
            critical=self.critical[step],
            p=state.p,
            step_time=now - self.marks["start"],
            compute_time=self.marks["allreduce"] - self.marks["start"],
            allreduce_time=self.marks["barrier"] - self.marks["allreduce"],
            barrier_time=now - self.marks["barrier"],
            grad_expected=plan.expected_gradient_bytes,
            grad_budget=state.budget,
            bound_held=self.endpoint.step_problem(step) is None,
            grad_received=state.received,
            grad_forgiven=state.forgiven,
            grad_shed=shed,
            grad_retransmitted=retx,
            misclassified=step in self.cfg.misclassify,
            ended=now,
            trim_fifths=self.endpoint.trim_profile(step, self.marks["start"], now),
            allreduce_trim_fifths=self.endpoint.trim_profile(
                step, self.marks["allreduce"], self.marks["barrier"]
            ),
        )
        self.endpoint.forget_step(step - 1)
        self._forget(step - 1)
        self.steps_done = step
        if step < self.cfg.steps:
            self._start_step(step + 1, now)
            return
        tail = self.bursts + [m for s in self.plans.values() for m in s.burst_sends + s.burst_recvs]
        needs = [
            *_recvs(m for m in tail if m.dst == self.cfg.rank),
            *_sends(plan.barrier_sends),
            *_sends(m for m in tail if m.src == self.cfg.rank),
        ]
        self._when(needs, self._finish, now)

    def _forget(self, step: int) -> None:
        """Drop what this rank holds of `step` once the step after it has finished: nothing
        waits on its flows any more, so a rank's memory stays flat however many steps it
        runs (the 200-step soak, docs/soak.md). Its bursts, which the run's end waits for,
        are kept; a late completion of one of its flows (a barrier's sender hearing its
        last ACK) is ignored (`handle_event`)."""
        plan = self.plans.pop(step, None)
        if plan is None:
            return
        self.bursts += plan.burst_sends + plan.burst_recvs
        kept = {m.flow for m in self.bursts}
        for msgs in (plan.compute_sends, plan.compute_recvs, plan.gradient_sends,
                     plan.gradient_recvs, plan.barrier_sends, plan.barrier_recvs):  # fmt: skip
            for msg in msgs:
                if msg.flow in kept:
                    continue
                self.messages.pop(msg.flow, None)
                self.received.pop(msg.flow, None)
                self.sent.pop(msg.flow, None)
                self._unsettle((("recv", msg.flow), ("send", msg.flow), ("acked", msg.flow)))
        self._unsettle((("compute", step), ("compute-done", step)))
        self.critical.pop(step, None)
        self.forgotten_below = step + 1

    def _finish(self, now: float) -> None:
        expected = self.totals["expected"]
        self._record(
            records.TRAIN_DONE,
            steps=self.cfg.steps,
            total_time=now - self.started,
            grad_expected=expected,
            grad_forgiven=self.totals["forgiven"],
            grad_shed=self.totals["shed"],
            grad_shed_sent=self.totals["shed_sent"],
            grad_retransmitted=self.totals["retransmitted"],
            lost_fraction=(self.totals["forgiven"] + self.totals["shed"]) / max(expected, 1),
            content_errors=self.totals["content_errors"],
            bound_violations=self.totals["bound_violations"],
        )
        self.trained = True
        self._call_at(now + LINGER_S, self._linger_over)

    def _linger_over(self, now: float) -> None:
        self.finished = True


def _recvs(msgs: Iterable[Message]) -> list[Token]:
    return [("recv", m.flow) for m in msgs]


def _sends(msgs: Iterable[Message]) -> list[Token]:
    return [("send", m.flow) for m in msgs]
