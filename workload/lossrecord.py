"""The loss record: which gradient bytes a run gave up, and where in the ring schedule they sat.

A replay of a run's loss into a real model needs to know, per step, which
bytes of which chunk each rank went without, and whether the flow that lost
them was a reduce-scatter hop (a partial sum lost) or an all-gather hop (a
reduced chunk lost). The receiving rank knows this when a gradient flow
completes: the receiver core's forgiven ranges, or the whole message when the
sender shed it. Nothing here depends on how the bytes moved, so any engine that
runs the plan of `workload.plan` writes the same record; the schema is in
docs/impact.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from common import records
from common.wire import PACKET_BYTES
from workload.plan import (
    Kind,
    Message,
    TrainingConfig,
    chunk_bounds,
    ring_chunk,
    ring_next,
)

SCHEMA = "forgive-loss/1"
REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"
FORGIVEN = "forgiven"
SHED = "shed"
_STATES = (FORGIVEN, SHED)


class LossRecordError(ValueError):
    """A loss record that does not describe the ring schedule it claims to."""


def _int(doc: Mapping[str, Any], key: str, lo: int, hi: int | None = None) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise LossRecordError(f"{key}: expected an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise LossRecordError(f"{key}: {value} is not {bound}")
    return value


@dataclass(frozen=True)
class Layout:
    """The ring all-reduce every step runs: ranks, gradient bytes per rank, chunks, ring order."""

    ranks: int
    grad_bytes: int
    steps: int
    packet_bytes: int = PACKET_BYTES

    @classmethod
    def of(cls, cfg: TrainingConfig) -> Layout:
        return cls(len(cfg.ranks), cfg.grad_bytes, cfg.steps)

    @property
    def phases(self) -> int:
        """Ring phases per step: n-1 of reduce-scatter, then n-1 of all-gather."""
        return 2 * (self.ranks - 1)

    @property
    def chunks(self) -> list[tuple[int, int]]:
        return chunk_bounds(self.grad_bytes, self.ranks)

    @property
    def ring(self) -> list[int]:
        """Ranks in ring order: ring[i] sends to ring[i + 1], the last to the first."""
        order = [0]
        while len(order) < self.ranks:
            order.append(ring_next(order[-1], self.ranks))
        return order

    def place(self, phase_index: int) -> tuple[str, int]:
        """(phase, ring step within it) of ring phase `phase_index` (0 .. 2(n-1)-1)."""
        if phase_index < self.ranks - 1:
            return REDUCE_SCATTER, phase_index
        return ALL_GATHER, phase_index - (self.ranks - 1)

    def phase_index(self, phase: str, ring_step: int) -> int:
        return ring_step if phase == REDUCE_SCATTER else self.ranks - 1 + ring_step

    def chunk(self, src: int, phase_index: int) -> int:
        return ring_chunk(src, phase_index, self.ranks)

    def step_bytes(self) -> int:
        """Gradient bytes all ranks together receive in one step's all-reduce."""
        sizes = [size for _, size in self.chunks]
        return sum(
            sizes[self.chunk(src, j)] for src in range(self.ranks) for j in range(self.phases)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "grad_bytes": self.grad_bytes,
            "steps": self.steps,
            "packet_bytes": self.packet_bytes,
            "ring": self.ring,
            "chunks": [list(c) for c in self.chunks],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Layout:
        ranks = _int(doc, "ranks", 2)
        layout = cls(
            ranks,
            _int(doc, "grad_bytes", ranks),
            _int(doc, "steps", 1),
            _int(doc, "packet_bytes", 1),
        )
        derived = layout.to_json()
        for key in ("ring", "chunks"):
            if key in doc and doc[key] != derived[key]:
                raise LossRecordError(
                    f"layout {key} {doc[key]!r} is not the plan's {derived[key]!r}"
                )
        return layout


@dataclass(frozen=True)
class LossEntry:
    """One gradient flow that lost bytes: its place in the ring and the ranges it went without.

    Ranges are [lo, hi) byte offsets within the chunk (the flow's message is the whole
    chunk, or its part's piece of it when the all-reduce is split: TrainingConfig.splits):
    add the chunk's offset for the position in the rank's buffer.
    """

    step: int
    src: int
    dst: int
    phase: str
    ring_step: int
    chunk: int
    flow: int
    ranges: tuple[tuple[int, int, str], ...]
    split: int = 0
    """The part of a split all-reduce the flow carried; written only when not 0, so a run
    whose all-reduce is not split records what it always did."""

    @property
    def lost_bytes(self) -> int:
        return sum(hi - lo for lo, hi, _ in self.ranges)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "src": self.src,
            "dst": self.dst,
            "phase": self.phase,
            "ring_step": self.ring_step,
            "chunk": self.chunk,
            "flow": self.flow,
            "ranges": [list(r) for r in self.ranges],
            **({"split": self.split} if self.split else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], layout: Layout) -> LossEntry:
        """Parse one entry and check it against the layout's ring schedule."""
        n = layout.ranks
        step = _int(doc, "step", 1, layout.steps)
        src = _int(doc, "src", 0, n - 1)
        dst = _int(doc, "dst", 0, n - 1)
        if dst != ring_next(src, n):
            raise LossRecordError(
                f"step {step}: rank {src} sends to {ring_next(src, n)}, not {dst}"
            )
        phase = doc.get("phase")
        if phase not in (REDUCE_SCATTER, ALL_GATHER):
            raise LossRecordError(f"step {step}: unknown phase {phase!r}")
        ring_step = _int(doc, "ring_step", 0, n - 2)
        chunk = _int(doc, "chunk", 0, n - 1)
        expected = layout.chunk(src, layout.phase_index(phase, ring_step))
        if chunk != expected:
            raise LossRecordError(
                f"step {step}: rank {src} sends chunk {expected} in {phase} step {ring_step}, not {chunk}"
            )
        size = layout.chunks[chunk][1]
        ranges: list[tuple[int, int, str]] = []
        raw = doc.get("ranges")
        if not isinstance(raw, list) or not raw:
            raise LossRecordError(f"step {step}: an entry needs a non-empty list of ranges")
        for item in raw:
            if not (isinstance(item, list) and len(item) == 3):
                raise LossRecordError(f"step {step}: range {item!r} is not [lo, hi, state]")
            lo, hi, state = item
            if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi <= size):
                raise LossRecordError(
                    f"step {step}: range [{lo}, {hi}) outside chunk of {size} bytes"
                )
            if state not in _STATES:
                raise LossRecordError(f"step {step}: unknown range state {state!r}")
            if ranges and lo < ranges[-1][1]:
                raise LossRecordError(f"step {step}: ranges overlap or are out of order")
            ranges.append((lo, hi, state))
        split = _int(doc, "split", 0) if "split" in doc else 0
        return cls(
            step, src, dst, phase, ring_step, chunk, _int(doc, "flow", 0), tuple(ranges), split
        )


def may_lose(msg: Message | None) -> TypeGuard[Message]:
    """Whether a flow can have a loss entry at all: only the gradient's messages can."""
    return msg is not None and msg.kind == Kind.GRADIENT


def entry_from_completion(
    cfg: TrainingConfig, msg: Message | None, event: Mapping[str, Any]
) -> LossEntry | None:
    """The entry for a completed flow at its receiving rank, or None if it lost nothing.

    `event` is the agent's `recv_done`: a shed flow lost its whole message; any
    other flow lost its `forgiven_ranges` (absent when nothing was forgiven).
    """
    if not may_lose(msg):
        return None
    at = msg.offset
    if event.get("shed"):
        ranges = [(at, at + msg.size, SHED)] if msg.size else []
    else:
        ranges = [
            (at + int(lo), at + int(hi), FORGIVEN) for lo, hi in event.get("forgiven_ranges", ())
        ]
    if not ranges:
        return None
    layout = Layout.of(cfg)
    phase, ring_step = layout.place(msg.phase)
    return LossEntry(
        step=int(event["step"]),
        src=msg.src,
        dst=msg.dst,
        phase=phase,
        ring_step=ring_step,
        chunk=layout.chunk(msg.src, msg.phase),
        flow=msg.flow,
        ranges=tuple(ranges),
        split=msg.split,
    )


@dataclass(frozen=True)
class StepClass:
    """How the run classified a step: critical or not, and the loss probability that gave."""

    step: int
    critical: bool
    p: float


@dataclass
class LossRecord:
    """A whole run's loss: the layout, each step's classification, every flow that lost bytes."""

    layout: Layout
    steps: list[StepClass]
    entries: list[LossEntry] = field(default_factory=list)
    engine: str = ""
    """Which engine wrote the record (the replay never reads it)."""

    def lost_bytes(self, step: int) -> int:
        return sum(e.lost_bytes for e in self.entries if e.step == step)

    def step_rate(self, step: int) -> float:
        """The fraction of the step's gradient bytes, over all ranks, that were given up."""
        return self.lost_bytes(step) / self.layout.step_bytes()

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "engine": self.engine,
            "layout": self.layout.to_json(),
            "steps": [{"step": s.step, "critical": s.critical, "p": s.p} for s in self.steps],
            "entries": [e.to_json() for e in self.entries],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> LossRecord:
        if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
            found = doc.get("schema") if isinstance(doc, Mapping) else type(doc).__name__
            raise LossRecordError(f"not a {SCHEMA} loss record (schema {found!r})")
        layout = Layout.from_json(doc.get("layout") or {})
        steps = []
        for item in doc.get("steps") or []:
            step = _int(item, "step", 1, layout.steps)
            p = item.get("p")
            if not isinstance(p, int | float) or not 0.0 <= p < 1.0:
                raise LossRecordError(f"step {step}: p {p!r} outside [0, 1)")
            steps.append(StepClass(step, bool(item.get("critical")), float(p)))
        if sorted(s.step for s in steps) != list(range(1, layout.steps + 1)):
            raise LossRecordError(f"steps must classify every step 1..{layout.steps} once")
        entries = [LossEntry.from_json(e, layout) for e in doc.get("entries") or []]
        seen = set()
        for e in entries:
            key = (e.step, e.src, e.phase, e.ring_step, e.split)
            if key in seen:
                raise LossRecordError(
                    f"step {e.step}: two entries for rank {e.src}'s {e.phase} step {e.ring_step}"
                    + (f" of part {e.split}" if e.split else "")
                )
            seen.add(key)
        return cls(layout, sorted(steps, key=lambda s: s.step), entries, str(doc.get("engine", "")))


def _strip(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A record line without the fields every training record carries."""
    return {k: v for k, v in doc.items() if k not in (records.TYPE, "rank")}


def assemble(
    layouts: Sequence[Mapping[str, Any]],
    entries: Iterable[Mapping[str, Any]],
    steps: Sequence[StepClass],
    engine: str,
) -> LossRecord:
    """One run's record from every rank's layout line and loss lines; the ranks must agree."""
    docs = [_strip(d) for d in layouts]
    if not docs:
        raise LossRecordError("no rank wrote a loss layout")
    if any(d != docs[0] for d in docs):
        raise LossRecordError("the ranks wrote different loss layouts")
    record = LossRecord.from_json(
        {
            "schema": SCHEMA,
            "engine": engine,
            "layout": docs[0],
            "steps": [{"step": s.step, "critical": s.critical, "p": s.p} for s in steps],
            "entries": [_strip(e) for e in entries],
        }
    )
    layout = record.layout
    record.entries.sort(
        key=lambda e: (e.step, layout.phase_index(e.phase, e.ring_step), e.src, e.split)
    )
    return record
