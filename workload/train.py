"""`forgive-train`: an emulated data-parallel training loop driving its host's agent in-process.

Per step: a compute phase that carries tensor- and pipeline-parallel traffic
(never forgivable), a ring all-reduce of the gradient (reduce-scatter, then
all-gather) in which a rank forwards a chunk only once the chunk it depends on
is settled, by arrival or forgiveness, then a barrier among all ranks. The
detector classifies step s+1 before the barrier of step s is sent, so each
step's loss budget exists before any rank can send that step's gradients.

Every delivered byte is checked against the content its sender generated:
non-gradient messages must match exactly; a gradient chunk may differ only in
zero-filled bytes, no more of them than the receiver says it forgave.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, Any

from host_agent.agent import HostAgent
from host_agent.cli import agent_arguments, config_from, exit_on_signals
from host_agent.core import AccordionDetector, CriticalRegimeDetector, StaticSchedule
from host_agent.stats import bound_violation
from workload.lossrecord import Layout, entry_from_completion
from workload.plan import Kind, Message, StepPlan, TrainingConfig, plan_step, synthetic_norms
from workload.plan import message_bytes as content_of

LINGER_S = 0.2
"""How long a finished rank keeps acknowledging, in case a peer's last ACK was lost."""
_CHECK_BLOCK = 4096


@dataclass
class _Wait:
    recvs: set[int]
    sends: set[int]
    then: Callable[[], None]


def make_detector(cfg: TrainingConfig) -> CriticalRegimeDetector:
    if cfg.detector == "accordion":
        return AccordionDetector()
    return StaticSchedule(steps=cfg.steps)


def classify(detector: CriticalRegimeDetector, norms: list[float], step: int) -> bool:
    """Classify `step` before its gradients flow, from the norm of the step before it."""
    return bool(detector.classify(step, norms[step - 2] if step >= 2 else None))


def gradient_mismatch(payload: bytes, expected: bytes) -> tuple[int, int]:
    """(bytes that differ, of those the ones that are not zero-filled), compared block-wise."""
    differ = nonzero = 0
    for lo in range(0, len(expected), _CHECK_BLOCK):
        got = payload[lo : lo + _CHECK_BLOCK]
        want = expected[lo : lo + _CHECK_BLOCK]
        if got != want:
            for a, b in zip(got, want, strict=True):
                if a != b:
                    differ += 1
                    nonzero += a != 0
    return differ, nonzero


class Trainer:
    """One rank's training loop, as callbacks on its agent's event loop."""

    def __init__(self, cfg: TrainingConfig, agent: HostAgent, out: IO[str]) -> None:
        cfg.validate()
        self.cfg = cfg
        self.agent = agent
        self.out = out
        self.detector = make_detector(cfg)
        self.norms = synthetic_norms(cfg)
        self.plans: dict[int, StepPlan] = {}
        self.messages: dict[int, Message] = {}
        self.recv_done: dict[int, dict[str, Any]] = {}
        self.send_done: dict[int, dict[str, Any]] = {}
        self.waits: list[_Wait] = []
        self.critical: dict[int, bool] = {}
        self.marks: dict[str, float] = {}
        self.totals: Counter = Counter()
        self.finished = False
        self.started = time.monotonic()
        agent.listeners.append(self._on_event)

    # ----- bookkeeping ---------------------------------------------------------------

    def _plan(self, step: int) -> StepPlan:
        plan = self.plans.get(step)
        if plan is None:
            plan = self.plans[step] = plan_step(self.cfg, step)
        return plan

    def _record(self, kind: str, **fields: Any) -> None:
        record = {"type": kind, "rank": self.cfg.rank, **fields}
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def _when(self, recvs: Iterable[Message], sends: Iterable[Message], then) -> None:
        self.waits.append(_Wait({m.flow for m in recvs}, {m.flow for m in sends}, then))
        self._fire_waits()

    def _fire_waits(self) -> None:
        while True:
            ready = [
                w
                for w in self.waits
                if w.recvs.issubset(self.recv_done) and w.sends.issubset(self.send_done)
            ]
            if not ready:
                return
            for w in ready:
                self.waits.remove(w)
                w.then()

    def _send(self, msg: Message, step: int) -> None:
        self.messages[msg.flow] = msg
        self.agent.send(
            self.cfg.ranks[msg.dst], msg.flow, content_of(self.cfg, msg), msg.traffic_class, step
        )

    def _register(self, step: int) -> None:
        for msg in self._plan(step).registrations():
            self.messages[msg.flow] = msg
            self.agent.register_flow(msg.flow, step, msg.traffic_class, deliver=True, size=msg.size)

    def _on_event(self, event: dict[str, Any], payload: bytes | None) -> None:
        flow = event["flow"]
        if event["event"] == "send_done":
            self.send_done[flow] = event
        elif event["event"] == "recv_done":
            self.recv_done[flow] = event
            self._check_content(event, payload)
            entry = entry_from_completion(self.cfg, self.messages.get(flow), event)
            if entry is not None:
                self._record("loss", **entry.to_json())
        self._fire_waits()

    def _check_content(self, event: dict[str, Any], payload: bytes | None) -> None:
        msg = self.messages.get(event["flow"])
        if msg is None or event.get("shed"):
            return
        expected = content_of(self.cfg, msg)
        if payload == expected:
            return
        if payload is None or len(payload) != len(expected):
            problem = f"flow {msg.flow}: {None if payload is None else len(payload)} bytes delivered, {len(expected)} sent"
        elif msg.kind != Kind.GRADIENT:
            problem = f"flow {msg.flow} ({msg.traffic_class}): content differs"
        else:
            differ, nonzero = gradient_mismatch(payload, expected)
            forgiven = event.get("forgiven_bytes", 0)
            if nonzero == 0 and differ <= forgiven:
                return
            problem = f"gradient flow {msg.flow}: {differ} bytes differ ({nonzero} not zero-filled), {forgiven} forgiven"
        self.totals["content_errors"] += 1
        print(f"forgive-train: CONTENT ERROR at rank {self.cfg.rank}: {problem}", file=sys.stderr)
        self._record("content_error", flow=msg.flow, problem=problem)

    # ----- the training loop ---------------------------------------------------------

    def start(self) -> None:
        """Register step 1 and the start-up barrier, then wait for every rank to be up."""
        self._record("loss_layout", **Layout.of(self.cfg).to_json())
        self._classify_and_begin(1)
        barrier = self._plan(0)
        for msg in barrier.barrier_recvs:
            self.messages[msg.flow] = msg
            self.agent.register_flow(msg.flow, 0, msg.traffic_class, deliver=True, size=msg.size)
        for msg in barrier.barrier_sends:
            self._send(msg, 0)
        self._when(barrier.barrier_recvs, [], lambda: self._start_step(1))

    def _classify_and_begin(self, step: int) -> None:
        critical = classify(self.detector, self.norms, step)
        self.critical[step] = critical
        self.agent.begin_step(step, critical, self._plan(step).expected_gradient_bytes)
        self._register(step)

    def _start_step(self, step: int) -> None:
        plan = self._plan(step)
        self.marks = {"start": time.monotonic()}
        for msg in plan.compute_sends:
            self._send(msg, step)
        timer = Message(-step, self.cfg.rank, self.cfg.rank, 0, Kind.TENSOR_PARALLEL)
        self.agent.call_later(
            self.cfg.compute_s, lambda: self._on_event({"event": "send_done", "flow": -step}, None)
        )
        self._when(
            plan.compute_recvs,
            [*plan.compute_sends, timer],
            lambda: self._start_allreduce(step),
        )

    def _start_allreduce(self, step: int) -> None:
        plan = self._plan(step)
        self.marks["allreduce"] = time.monotonic()
        for msg in plan.burst_sends:
            self._send(msg, step)
        sends = plan.gradient_sends
        self._send(sends[0], step)
        for prev, nxt in zip(plan.gradient_recvs, sends[1:], strict=False):
            self._when([prev], [], lambda nxt=nxt: self._send(nxt, step))
        self._when(plan.gradient_recvs, sends, lambda: self._allreduce_done(step))

    def _allreduce_done(self, step: int) -> None:
        self.marks["barrier"] = time.monotonic()
        self.agent.complete_step(step)
        if step < self.cfg.steps:
            self._classify_and_begin(step + 1)
        plan = self._plan(step)
        for msg in plan.barrier_sends:
            self._send(msg, step)
        self._when(plan.barrier_recvs, [], lambda: self._step_done(step))

    def _step_done(self, step: int) -> None:
        now = time.monotonic()
        plan = self._plan(step)
        state = self.agent.step_state(step)
        shed = sum(
            self.recv_done[m.flow].get("bytes") or 0
            for m in plan.gradient_recvs
            if self.recv_done[m.flow].get("shed")
        )
        shed_sent = sum(
            self.send_done[m.flow].get("bytes") or 0
            for m in plan.gradient_sends
            if self.send_done[m.flow].get("shed")
        )
        retx = sum(
            self.send_done[m.flow].get("retransmitted_bytes", 0) for m in plan.gradient_sends
        )
        self.totals["expected"] += plan.expected_gradient_bytes
        self.totals["forgiven"] += state["forgiven"]
        self.totals["shed"] += shed
        self.totals["shed_sent"] += shed_sent
        self.totals["retransmitted"] += retx
        self._record(
            "train_step",
            step=step,
            critical=self.critical[step],
            p=state["p"],
            step_time=now - self.marks["start"],
            compute_time=self.marks["allreduce"] - self.marks["start"],
            allreduce_time=self.marks["barrier"] - self.marks["allreduce"],
            barrier_time=now - self.marks["barrier"],
            grad_expected=plan.expected_gradient_bytes,
            grad_budget=state["budget"],
            bound_held=bound_violation(state, self.agent.policy.vesting) is None,
            grad_received=state["received"],
            grad_forgiven=state["forgiven"],
            grad_shed=shed,
            grad_retransmitted=retx,
        )
        self.agent.forget_step(step - 1)
        if step < self.cfg.steps:
            self._start_step(step + 1)
            return
        tail = [m for s in self.plans.values() for m in s.burst_sends + s.burst_recvs]
        self._when(
            [m for m in tail if m.dst == self.cfg.rank],
            [*plan.barrier_sends, *(m for m in tail if m.src == self.cfg.rank)],
            self._finish,
        )

    def _finish(self) -> None:
        expected = self.totals["expected"]
        self._record(
            "train_done",
            steps=self.cfg.steps,
            total_time=time.monotonic() - self.started,
            grad_expected=expected,
            grad_forgiven=self.totals["forgiven"],
            grad_shed=self.totals["shed"],
            grad_shed_sent=self.totals["shed_sent"],
            grad_retransmitted=self.totals["retransmitted"],
            lost_fraction=(self.totals["forgiven"] + self.totals["shed"]) / max(expected, 1),
            content_errors=self.totals["content_errors"],
            bound_violations=self.agent.counters["bound_violations"],
        )
        self.agent.call_later(LINGER_S, self._linger_over)

    def _linger_over(self) -> None:
        self.finished = True

    @property
    def failed(self) -> bool:
        return bool(self.totals["content_errors"] or self.agent.counters["bound_violations"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="forgive-train", description=__doc__)
    agent_arguments(parser)
    defaults = TrainingConfig(ranks=("", ""), rank=0)
    parser.add_argument("--ranks", required=True, help="IPv4 of every rank, comma-separated")
    parser.add_argument("--rank", type=int, required=True, help="this host's index in --ranks")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--grad-bytes", type=int, default=defaults.grad_bytes)
    parser.add_argument("--compute-ms", type=float, default=defaults.compute_s * 1e3)
    parser.add_argument("--tp-bytes", type=int, default=defaults.tp_bytes)
    parser.add_argument("--pp-bytes", type=int, default=defaults.pp_bytes)
    parser.add_argument("--detector", default=defaults.detector, help="static or accordion")
    parser.add_argument("--burst-step", type=int, help="step of the background burst (none)")
    parser.add_argument("--burst-bytes", type=int, default=defaults.burst_bytes)
    parser.add_argument("--burst-src", type=int, default=defaults.burst_src)
    parser.add_argument("--burst-dst", type=int, default=defaults.burst_dst)
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this, s")
    parser.add_argument("--out", default="-", help="JSON-lines training records ('-': stdout)")
    args = parser.parse_args(argv)
    try:
        agent_config = config_from(args)
        cfg = TrainingConfig(
            ranks=tuple(args.ranks.split(",")),
            rank=args.rank,
            steps=args.steps,
            grad_bytes=args.grad_bytes,
            compute_s=args.compute_ms / 1e3,
            tp_bytes=args.tp_bytes,
            pp_bytes=args.pp_bytes,
            detector=args.detector,
            burst_step=args.burst_step,
            burst_bytes=args.burst_bytes,
            burst_src=args.burst_src,
            burst_dst=args.burst_dst,
            seed=args.seed,
        )
        cfg.validate()
        if agent_config.ip is not None and agent_config.ip != cfg.ranks[cfg.rank]:
            raise ValueError(f"--ip {agent_config.ip} is not rank {cfg.rank}'s address")
        agent_config.ip = cfg.ranks[cfg.rank]
        agent = HostAgent(agent_config)
    except (ValueError, OSError) as exc:
        print(f"forgive-train: {exc}", file=sys.stderr)
        return 2
    exit_on_signals()
    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
    trainer = Trainer(cfg, agent, out)
    deadline = time.monotonic() + args.timeout
    try:
        trainer.start()
        agent.run(until=lambda: trainer.finished or time.monotonic() > deadline)
    except KeyboardInterrupt:
        return 130
    finally:
        agent.close()
        if out is not sys.stdout:
            out.close()
    if not trainer.finished:
        print(f"forgive-train: rank {cfg.rank} timed out after {args.timeout} s", file=sys.stderr)
        return 1
    return 1 if trainer.failed else 0


if __name__ == "__main__":
    sys.exit(main())
