"""What one emulated data-parallel rank sends and expects on each training step.

Everything here is a pure function of the configuration, so every rank
computes the same flow ids and sizes for its peers without exchanging them:
that is how a receiver registers a flow before its first byte arrives.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import asdict, dataclass, field, fields
from enum import IntEnum
from typing import Any

from common.frames import ip_bytes
from host_agent.core.detector import StaticSchedule

MAX_STEPS = 1 << 12
MAX_RANKS = 1 << 7
_INDEX_BITS = 10


class Kind(IntEnum):
    GRADIENT = 0
    TENSOR_PARALLEL = 1
    PIPELINE_PARALLEL = 2
    BARRIER = 3
    BURST = 4


TRAFFIC_CLASS = {
    Kind.GRADIENT: "gradient",
    Kind.TENSOR_PARALLEL: "tensor-parallel",
    Kind.PIPELINE_PARALLEL: "pipeline-parallel",
    Kind.BARRIER: "other",
    Kind.BURST: "other",
}
BARRIER_BYTES = 64


TP_PHASES = ("own", "overlap")
COMPLETIONS = ("receiver", "sender-ack")
"""When a ring message counts as received: when its receiver holds its bytes, or when its
sender has the ACK of its last byte (TrainingConfig.completion)."""


@dataclass(frozen=True)
class TrainingConfig:
    """An emulated training job; every rank runs with the same values but its own `rank`."""

    ranks: tuple[str, ...]
    """IPv4 address of every rank, in rank order."""
    rank: int
    steps: int = 20
    grad_bytes: int = 4 << 20
    """Gradient bytes per rank all-reduced on each step (split in len(ranks) ring chunks)."""
    compute_s: float = field(default=0.005, metadata={"flag": "--compute-ms", "scale": 1e-3})
    """Length of each step's compute phase, which carries the TP and PP traffic."""
    tp_bytes: int = 256 << 10
    """Bytes each rank sends to every other member of its tensor-parallel group per step; 0: none."""
    tp_group: int = 2
    """Ranks per tensor-parallel group (consecutive ranks; the last group may be smaller). The
    group all-to-alls during the compute phase; at 2 that is an exchange with rank ^ 1."""
    pp_bytes: int = 128 << 10
    """Bytes each rank sends to the next pipeline stage (rank + 1) per step; 0: none."""
    tp_phase: str = "own"
    """'own': the all-reduce starts once the compute phase and its TP/PP traffic are done;
    'overlap': it starts with them (gradients ready layer by layer in the backward pass), and
    the step's barrier waits for both."""
    splits: int = 1
    """The all-reduce split into this many parts of the gradient, each its own ring of
    2 (n - 1) messages of a part over n, as ASTRA-sim's system layer splits a collective
    (`preferred-dataset-splits`, 4 in its shipped Ring.json). Part k of the ring carries the
    k-th piece of every ring chunk, so a chunk's bytes stay where the loss record puts them."""
    active_splits: int = 1
    """How many of those rings run at once: part k starts once part k - active_splits is done
    at this rank (ASTRA-sim's `active-chunks-per-dimension`, 1 in Ring.json)."""
    reduce_bytes_per_s: float = 0.0
    """How fast a rank reduces a reduce-scatter message into its own chunk before forwarding
    it: the message waits three passes over its bytes at this rate (a write and two reads),
    as ASTRA-sim's system layer holds it (`PacketBundle::call` at `local-mem-bw`, 50 GB/s in
    its Ring.json). 0: at once. At the run's scale: the fabric's rate over the rate scale."""
    completion: str = "receiver"
    """'receiver': a ring message is received when its receiver holds its bytes (settled by
    arrival or forgiveness); 'sender-ack': only once its sender also has the ACK of its last
    byte, which is when ASTRA-sim's ns-3 frontend tells the receiver (its `qp_finish` calls
    both sides' handlers), so each ring step waits about an ACK's trip back. Only an engine
    that can tell a rank of its peer's completion offers it: the simulator."""
    detector: str = "static"
    """'static' (steps 1, 2, 3 and the last are critical) or 'accordion' (synthetic norms)."""
    critical: tuple[int, ...] = ()
    """The static schedule's critical steps; empty: the note's 1, 2, 3 and the last. A
    shorter run keeps the note's share of critical steps (4 of 20) with one in five."""
    misclassify: tuple[int, ...] = ()
    """Steps on which the detector's verdict is wrong on purpose (core.detector.Misclassifying)."""
    burst_step: int | None = None
    """Step on which a background burst (class other) runs beside the all-reduce; None: none."""
    burst_bytes: int = 8 << 20
    burst_src: int = 0
    burst_dst: int = 1
    seed: int = 0

    def to_json(self) -> str:
        """The configuration as one JSON object: how the runner hands it to `forgive-train`."""
        return json.dumps(asdict(self))

    def schedule(self) -> StaticSchedule:
        """The static schedule of `critical` (StaticSchedule.of); ValueError on a step outside
        the run."""
        return StaticSchedule.of(self.steps, self.critical)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainingConfig:
        """Build and validate a configuration; ValueError names an unknown or bad field. The
        critical steps stay as given (`schedule().setting()` is their one form): `()` is the
        note's 1, 2, 3 and last of the run's own length, so folding named steps into it here
        would change them when a flag on top of a --config changes `steps`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown training setting(s) {', '.join(unknown)}")
        missing = sorted(k for k in ("ranks", "rank") if k not in values)
        if missing:
            raise ValueError(f"training settings lack {', '.join(missing)}")
        ranks = values["ranks"]
        if isinstance(ranks, str):
            ranks = ranks.split(",")
        if not isinstance(ranks, list | tuple) or not all(isinstance(r, str) for r in ranks):
            raise ValueError("ranks must be a list of IPv4 addresses")
        for f in fields(cls):
            value = values.get(f.name)
            if f.name != "ranks" and value is not None and not _fits(value, f.type):
                raise ValueError(f"training setting {f.name} = {value!r} is not {f.type}")
        lists = {k: tuple(values.get(k, ())) for k in ("critical", "misclassify")}
        cfg = cls(**{**values, "ranks": tuple(ranks), **lists})
        cfg.validate()
        return cfg

    @classmethod
    def from_json(cls, text: str) -> TrainingConfig:
        try:
            values = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"training configuration is not JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("training configuration must be a JSON object")
        return cls.from_dict(values)

    def validate(self) -> None:
        n = len(self.ranks)
        for address in self.ranks:
            ip_bytes(address)
        if len(set(self.ranks)) != n:
            raise ValueError("every rank needs its own address")
        if not 2 <= n <= MAX_RANKS:
            raise ValueError(f"need 2..{MAX_RANKS} ranks, got {n}")
        if not 0 <= self.rank < n:
            raise ValueError(f"rank {self.rank} outside 0..{n - 1}")
        if not 1 <= self.steps < MAX_STEPS:
            raise ValueError(f"steps must lie in 1..{MAX_STEPS - 1}")
        if not self.splits >= 1 or 2 * (n - 1) * self.splits > 1 << _INDEX_BITS:
            raise ValueError(
                f"splits must lie in 1..{(1 << _INDEX_BITS) // (2 * (n - 1))} for {n} ranks "
                f"(2 (n - 1) messages per split in a step), got {self.splits}"
            )
        if not 1 <= self.active_splits <= self.splits:
            raise ValueError(
                f"active_splits must lie in 1..splits ({self.splits}), got {self.active_splits}"
            )
        if self.grad_bytes < n * self.splits:
            raise ValueError("grad_bytes must give every ring chunk's piece at least one byte")
        if not (0 <= self.reduce_bytes_per_s < float("inf")):
            raise ValueError(
                f"reduce_bytes_per_s must be a finite number >= 0, got {self.reduce_bytes_per_s}"
            )
        if self.completion not in COMPLETIONS:
            raise ValueError(
                f"completion must be one of {', '.join(COMPLETIONS)}, got {self.completion!r}"
            )
        if not 2 <= self.tp_group <= 1 << _INDEX_BITS:
            raise ValueError(f"tp_group must lie in 2..{1 << _INDEX_BITS}, got {self.tp_group}")
        if self.compute_s < 0 or self.tp_bytes < 0 or self.pp_bytes < 0:
            raise ValueError("compute time and TP/PP sizes must be >= 0")
        if self.tp_phase not in TP_PHASES:
            raise ValueError(
                f"tp_phase must be one of {', '.join(TP_PHASES)}, got {self.tp_phase!r}"
            )
        if self.detector not in ("static", "accordion"):
            raise ValueError(f"unknown detector {self.detector!r} (known: static, accordion)")
        try:
            self.schedule()
        except ValueError as exc:
            raise ValueError(f"critical: {exc}") from None
        outside = [s for s in self.misclassify if not 1 <= s <= self.steps]
        if outside:
            raise ValueError(f"misclassify: step {outside[0]} is outside 1..{self.steps}")
        if self.critical and self.detector != "static":
            raise ValueError(
                "critical steps are the static schedule's; the accordion detector finds its own"
            )
        if self.burst_step is not None:
            if not 1 <= self.burst_step <= self.steps:
                raise ValueError("burst step outside the run")
            if self.burst_bytes <= 0 or not (0 <= self.burst_src < n and 0 <= self.burst_dst < n):
                raise ValueError("burst needs positive bytes and valid source/destination ranks")
            if self.burst_src == self.burst_dst:
                raise ValueError("burst source and destination must differ")


def _fits(value: Any, type_name: str) -> bool:
    """Whether a JSON value suits a field annotated `type_name` (int, float, str, or None)."""
    if isinstance(value, bool):
        return False
    if type_name.startswith("tuple"):
        return isinstance(value, list | tuple) and all(_fits(v, "int") for v in value)
    if "float" in type_name:
        return isinstance(value, int | float)
    if "int" in type_name:
        return isinstance(value, int)
    return isinstance(value, str)


def flow_id(step: int, kind: Kind, src: int, index: int) -> int:
    """32-bit flow id: step (12 bits), kind (3), source rank (7), index (10).

    The source rank makes ids unique per receiver; kind and index make them
    unique per sender; the step keeps consecutive steps apart.
    """
    return (
        (step % MAX_STEPS) << 20 | int(kind) << 17 | src << _INDEX_BITS | index % (1 << _INDEX_BITS)
    )


def flow_step(flow: int) -> int:
    """The step a flow id names (steps are below MAX_STEPS, so the id holds it whole)."""
    return flow >> 20


def kind_of(flow: int) -> Kind:
    """The kind of message a flow id names: how a reader of the agents' records tells them apart."""
    return Kind(flow >> 17 & 0b111)


@dataclass(frozen=True)
class Message:
    flow: int
    src: int
    dst: int
    size: int
    kind: Kind
    phase: int = 0
    """Ring phase for gradient chunks (0 .. 2(n-1)-1), else 0."""
    split: int = 0
    """Which part of a split all-reduce a gradient message carries (TrainingConfig.splits)."""
    offset: int = 0
    """Where a gradient message's bytes start within its ring chunk: its part's piece."""

    @property
    def traffic_class(self) -> str:
        return TRAFFIC_CLASS[self.kind]


def chunk_sizes(total: int, n: int) -> list[int]:
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def chunk_bounds(total: int, n: int) -> list[tuple[int, int]]:
    """(offset, size) of each ring chunk within a rank's gradient buffer, by chunk index."""
    out, offset = [], 0
    for size in chunk_sizes(total, n):
        out.append((offset, size))
        offset += size
    return out


def ring_next(rank: int, n: int) -> int:
    """The rank `rank` sends its ring all-reduce chunks to."""
    return (rank + 1) % n


def chunk_owner(chunk: int, n: int) -> int:
    """The rank that holds `chunk` fully reduced after reduce-scatter and starts its all-gather."""
    return (chunk - 1) % n


def ring_chunk(rank: int, phase: int, n: int) -> int:
    """The chunk `rank` sends in ring `phase`: reduce-scatter for phase < n-1, then all-gather.

    In reduce-scatter phase j a rank forwards the chunk it received in phase
    j-1 with its own contribution added; in all-gather it forwards the fully
    reduced chunk it received last. Either way the chunk sent in phase j is the
    one received in phase j-1, which is the dependency the workload enforces.
    """
    if phase < n - 1:
        return (rank - phase) % n
    return (rank + 1 - (phase - (n - 1))) % n


def gradient_messages(cfg: TrainingConfig, step: int, src: int) -> list[Message]:
    """The ring all-reduce messages `src` sends on `step`: part by part (TrainingConfig.splits),
    each part's in phase order. Part k carries the k-th piece of each ring chunk."""
    n = len(cfg.ranks)
    pieces = [chunk_bounds(size, cfg.splits) for size in chunk_sizes(cfg.grad_bytes, n)]
    dst = ring_next(src, n)
    phases = 2 * (n - 1)
    out = []
    for k in range(cfg.splits):
        for j in range(phases):
            offset, size = pieces[ring_chunk(src, j, n)][k]
            out.append(
                Message(
                    flow_id(step, Kind.GRADIENT, src, k * phases + j),
                    src,
                    dst,
                    size,
                    Kind.GRADIENT,
                    j,
                    k,
                    offset,
                )
            )
    return out


def compute_messages(
    cfg: TrainingConfig, step: int, src: int, to: int | None = None
) -> list[Message]:
    """Tensor- and pipeline-parallel messages `src` sends during `step`'s compute phase (only
    those to rank `to`, if given: a receiver's plan then costs a message per peer, not one per
    pair of ranks)."""
    n = len(cfg.ranks)
    out = []
    group = cfg.tp_group
    base = src - src % group
    if cfg.tp_bytes:
        for peer in range(base, min(base + group, n)):
            if peer != src and (to is None or peer == to):
                out.append(
                    Message(
                        flow_id(step, Kind.TENSOR_PARALLEL, src, (peer - src) % group - 1),
                        src,
                        peer,
                        cfg.tp_bytes,
                        Kind.TENSOR_PARALLEL,
                    )
                )
    nxt = (src + 1) % n
    if cfg.pp_bytes and (to is None or nxt == to):
        out.append(
            Message(
                flow_id(step, Kind.PIPELINE_PARALLEL, src, 0),
                src,
                nxt,
                cfg.pp_bytes,
                Kind.PIPELINE_PARALLEL,
            )
        )
    return out


def barrier_messages(
    cfg: TrainingConfig, step: int, src: int, to: int | None = None
) -> list[Message]:
    """The barrier's messages from `src` to every other rank (to rank `to` only, if given)."""
    return [
        Message(flow_id(step, Kind.BARRIER, src, dst), src, dst, BARRIER_BYTES, Kind.BARRIER)
        for dst in (range(len(cfg.ranks)) if to is None else (to,))
        if dst != src
    ]


def burst_messages(
    cfg: TrainingConfig, step: int, src: int, to: int | None = None
) -> list[Message]:
    if cfg.burst_step != step or src != cfg.burst_src or to not in (None, cfg.burst_dst):
        return []
    return [
        Message(flow_id(step, Kind.BURST, src, 0), src, cfg.burst_dst, cfg.burst_bytes, Kind.BURST)
    ]


@dataclass(frozen=True)
class StepPlan:
    """One rank's traffic on one step (step 0 is the start-up barrier only)."""

    compute_sends: list[Message]
    compute_recvs: list[Message]
    gradient_sends: list[Message]
    gradient_recvs: list[Message]
    barrier_sends: list[Message]
    barrier_recvs: list[Message]
    burst_sends: list[Message]
    burst_recvs: list[Message]

    @property
    def expected_gradient_bytes(self) -> int:
        return sum(m.size for m in self.gradient_recvs)

    def registrations(self) -> list[Message]:
        return self.compute_recvs + self.gradient_recvs + self.barrier_recvs + self.burst_recvs


def plan_step(cfg: TrainingConfig, step: int) -> StepPlan:
    n = len(cfg.ranks)
    me = cfg.rank
    peers = [r for r in range(n) if r != me]
    barrier_recvs = [m for r in peers for m in barrier_messages(cfg, step, r, to=me)]
    if step == 0:
        return StepPlan([], [], [], [], barrier_messages(cfg, 0, me), barrier_recvs, [], [])
    return StepPlan(
        compute_sends=compute_messages(cfg, step, me),
        compute_recvs=[m for r in peers for m in compute_messages(cfg, step, r, to=me)],
        gradient_sends=gradient_messages(cfg, step, me),
        gradient_recvs=gradient_messages(cfg, step, (me - 1) % n),
        barrier_sends=barrier_messages(cfg, step, me),
        barrier_recvs=barrier_recvs,
        burst_sends=burst_messages(cfg, step, me),
        burst_recvs=[m for r in peers for m in burst_messages(cfg, step, r, to=me)],
    )


CONTENT_POOL_BYTES = (4 << 20) + 15
"""Length of the random pool every message's content is cut from: a prime, so a packet
moved within a message by a whole number of packets lands on other bytes."""
_SPREAD = 2654435761
"""Knuth's multiplier: spreads the structured flow ids over the pool."""


@functools.lru_cache(maxsize=4)
def _content_pool(seed: int) -> bytes:
    return random.Random(f"content pool {seed}").randbytes(CONTENT_POOL_BYTES)


def message_bytes(cfg: TrainingConfig, msg: Message) -> bytes | memoryview:
    """The content of a message: deterministic, so the receiver can check every byte.

    It is the run's random pool read from a place the flow id picks, wrapping around:
    a view of the pool (a copy only where it wraps), not a fresh draw, since every
    message's content is made twice (by its sender and by its receiver, which checks it)
    and drawing it was 6 % of a simulation, copying it 2 %.
    Two flows whose places fall close together share most of their bytes, which a
    packet delivered to the wrong flow could hide; the flow id, not the bytes, is what
    places a packet in its flow."""
    pool = _content_pool(cfg.seed)
    start = msg.flow * _SPREAD % CONTENT_POOL_BYTES
    head = memoryview(pool)[start : start + msg.size]
    if len(head) == msg.size:
        return head
    whole, rest = divmod(msg.size - len(head), CONTENT_POOL_BYTES)
    return b"".join([head, *[pool] * whole, pool[:rest]])


def synthetic_norms(cfg: TrainingConfig) -> list[float]:
    """Gradient norms for steps 1..steps: a steep early fall, a plateau, a late disturbance.

    They stand in for what a real model would report, so Accordion's criterion
    has something to read; every rank derives the same list from the seed. The
    fall makes the first steps critical; the jump two steps before the end (as
    a learning-rate change would cause) makes the last two critical again.
    """
    rng = random.Random(f"norms:{cfg.seed}")
    out = []
    for step in range(1, cfg.steps + 1):
        norm = 1.0 + 30.0 * 0.35**step
        if step == cfg.steps - 2:
            norm *= 2.5
        out.append(norm * rng.uniform(0.98, 1.02))
    return out
