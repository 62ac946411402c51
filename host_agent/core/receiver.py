"""The FORGIVE receiver: scoreboard, per-step loss budget, forgiveness and the two report flags.

Each handler mirrors the note's pseudo-code of the same name (OnStepBegin,
OnAllReduceComplete, Unsettled, Flags, Repair, OnTrimmedHeader) and the
arrival table; the comments name the table row or branch a line implements.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from common.wire import (
    FTH_LEN,
    FTH_STRUCT,
    FTH_VERSION,
    PACKET_BYTES,
    Flag,
    MalformedPacket,
    Opcode,
    check_fields,
    unpack_fth,
)
from host_agent.core.fields import FieldMapping
from host_agent.core.scoreboard import SETTLED, RangeMap, State

_VO_ACK: Final = (FTH_VERSION << 4) | Opcode.ACK
_VO_NACK: Final = (FTH_VERSION << 4) | Opcode.NACK
_VO_CNP: Final = (FTH_VERSION << 4) | Opcode.CNP
_VO_DATA: Final = (FTH_VERSION << 4) | Opcode.DATA
_PACK_BELOW: Final = 256
"""Settled pieces shorter than this are packed together (`_keep`): a peer sending tiny
segments would otherwise cost an object, forty times its bytes, per segment."""
_PACK_UPTO: Final = 1 << 16
"""A packed part grows to this size, then the next tiny piece starts another."""
_ELIGIBLE: Final = int(Flag.ELIGIBLE)
_EXHAUSTED: Final = int(Flag.EXHAUSTED)
_ECE: Final = int(Flag.ECE)
_TRIMMED: Final = int(Flag.TRIMMED)
FINISHED_KEPT: Final = 1024
"""How many finished flows a receiver still answers for after forgetting them (their totals
alone, oldest dropped first). A sender may not have heard the last ACK of a flow whose
receiver has finished and forgotten it: a step ends on its receives, so a barrier's sender
goes on to the next step without that ACK, and its receiver may finish that step and
forget the flow while the ACK is lost (a switch restarting). The sender resends for up to
max_timeouts rounds; answered, its flow completes, where an unknown flow's DATA would be
dropped and the flow fail."""


@dataclass(frozen=True)
class ReceiverPolicy:
    """The note's parameters (P_low, P_high, P) plus the switches the policy variants need.

    `vesting=False` makes the whole budget available at step start (the note's
    full-budget comparison); `exemption=False` keeps forgiveness but never lets a
    sender ignore congestion signals. `cnp_interval` is DCQCN's notification-point
    interval: at most one CNP per flow per interval. With `cnp_at_window_end` a mark
    that arrives inside the interval is not lost: one CNP goes out when the interval
    ends (`poll`), as the DCQCN paper's notification point does; without it such marks
    send nothing, as a NIC's minimum time between CNPs does (docs/dcqcn.md).
    """

    p_low: float = 0.005
    p_high: float = 0.1
    forgive_prob: float = 1.0
    seed: int = 0
    vesting: bool = True
    exemption: bool = True
    cnp_interval: float = 50e-6
    keep_payload: bool = True
    cnp_at_window_end: bool = True

    def __post_init__(self) -> None:
        for name in ("p_low", "p_high", "forgive_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        for name in ("p_low", "p_high"):
            if getattr(self, name) >= 1.0:
                raise ValueError(f"{name} must be below 1, got {getattr(self, name)}")
        if self.cnp_interval < 0:
            raise ValueError(f"cnp_interval must be >= 0, got {self.cnp_interval}")


@dataclass
class StepEntry:
    """Per-step state at one receiving rank (the note's `steps[step]`)."""

    p: float
    budget: int
    expected: int
    p_exact: Fraction
    received: int = 0
    forgiven: int = 0
    outstanding: int = 0
    open: bool = True
    excess: int = 0
    """Gradient bytes beyond `expected`: received, but never credited to vesting."""

    def state(self) -> StepState:
        return StepState(
            p=self.p,
            budget=self.budget,
            expected=self.expected,
            received=self.received,
            forgiven=self.forgiven,
            outstanding=self.outstanding,
            open=self.open,
            excess=self.excess,
        )


@dataclass(frozen=True)
class StepState(FieldMapping):
    """A step's gradient accounting at one receiving rank, as `step_state` returns it (the
    fields of the host's `step` record, in its order)."""

    p: float
    budget: int
    expected: int
    received: int
    forgiven: int
    outstanding: int
    open: bool
    excess: int


class RxFlow:
    """One message being received: its scoreboard, what was forgiven, its bytes, its counts.

    One is made per message (plain, not a dataclass: common.native)."""

    def __init__(
        self,
        flow_id: int,
        step: int | None,
        gradient: bool,
        exemption_eligible: bool,
        *,
        total: int | None,
        parts: list[bytes | bytearray] | None,
        size_registered: bool,
    ) -> None:
        self.flow_id = flow_id
        self.step = step
        self.gradient = gradient
        self.exemption_eligible = exemption_eligible
        self.rcv_nxt: int = 0
        self.total = total
        self.scoreboard: RangeMap = RangeMap()
        self.forgiven: RangeMap = RangeMap()
        """Every range forgiven so far; the scoreboard drops them once rcv_nxt passes them."""
        self.parts = parts
        """The flow's bytes [0, buffered) in order, forgiven gaps as zeros; None when the
        payload is not kept. Joined once, when `payload` is asked for: a bytearray grown
        packet by packet is copied again whenever the allocator cannot grow it in place,
        which with many messages arriving at once is most of the time."""
        self.buffered = 0
        """Bytes in `parts`, kept rather than summed: every DATA packet reads it."""
        self.complete: bool = False
        self.received_bytes: int = 0
        self.forgiven_bytes: int = 0
        self.trims: int = 0
        self.ce_marks: int = 0
        self.cnps_sent: int = 0
        self.last_cnp: float | None = None
        self.cnp_pending: bool = False
        """A mark arrived inside the CNP interval; its CNP is due at the interval's end."""
        self.size_registered = size_registered
        """`total` came from the receiving side, not from the first packet."""
        self.held: dict[int, bytes] = {}
        """Received bytes above `buffered`, by start offset, until the bytes below them
        settle."""
        self.held_starts: list[int] = []
        """Heap of the keys of `held`."""

    def state(self) -> RxFlowState:
        return RxFlowState(
            rcv_nxt=self.rcv_nxt,
            exemption_eligible=self.exemption_eligible,
            complete=self.complete,
            total=self.total,
            step=self.step,
            gradient=self.gradient,
            received_bytes=self.received_bytes,
            forgiven_bytes=self.forgiven_bytes,
            trims=self.trims,
            ce_marks=self.ce_marks,
            cnps_sent=self.cnps_sent,
            requested_bytes=sum(e - s for s, e, st in self.scoreboard if st not in SETTLED),
            outstanding_bytes=self.scoreboard.count(State.OUTSTANDING),
        )


@dataclass(frozen=True)
class RxFlowState(FieldMapping):
    """A received flow as `flow_state` returns it."""

    rcv_nxt: int
    exemption_eligible: bool
    complete: bool
    total: int | None
    step: int | None
    gradient: bool
    received_bytes: int
    forgiven_bytes: int
    trims: int
    ce_marks: int
    cnps_sent: int
    requested_bytes: int
    """Bytes of the scoreboard not yet settled (neither received nor forgiven)."""
    outstanding_bytes: int
    """Of those, the ones counted in their step's `outstanding`."""


@dataclass(frozen=True)
class ReceiverCounts:
    """The receiver's packet counters, as `stats` returns them: every rejection but an
    unknown flow's counts as malformed."""

    malformed: int
    unknown_flow: int
    data: int
    trimmed: int
    duplicate: int
    finished: int


class ForgiveReceiver:
    """Sans-IO receiver: `receive` takes FTH bytes and returns the FTH replies to send back;
    `poll` returns the CNPs that fall due at the end of a notification interval.

    Every packet it drops is counted once in `rejected`, by reason: "short" and
    "bad_header" (fails `common.wire.check_fields`), "out_of_range" (a DATA range
    past the flow's length), "not_data" (control packets belong to the sender),
    "unknown_flow", and "total_mismatch" (a DATA whose length field disagrees with
    the flow's total).
    """

    def __init__(
        self, policy: ReceiverPolicy | None = None, rng: random.Random | None = None
    ) -> None:
        """`rng` replaces the policy's seeded draw: the NIC suite feeds the core the draws
        the NIC took, so both decide a range that vests alike."""
        self.policy = policy or ReceiverPolicy()
        self._rng = rng if rng is not None else random.Random(self.policy.seed)
        self._steps: dict[int, StepEntry] = {}
        self._flows: dict[int, RxFlow] = {}
        self._finished: dict[int, int] = {}
        """Flows finished and forgotten, oldest first: their totals (FINISHED_KEPT)."""
        self._completed: list[int] = []
        self._cnp_due: list[tuple[float, int]] = []
        self._counts = {"data": 0, "trimmed": 0, "duplicate": 0, "finished": 0}
        self.rejected: Counter[str] = Counter()

    @property
    def stats(self) -> ReceiverCounts:
        rejected = self.rejected
        unknown = rejected["unknown_flow"]
        counts = self._counts
        return ReceiverCounts(
            malformed=rejected.total() - unknown,
            unknown_flow=unknown,
            data=counts["data"],
            trimmed=counts["trimmed"],
            duplicate=counts["duplicate"],
            finished=counts["finished"],
        )

    # -- the host-local facts -------------------------------------------------

    def begin_step(self, step: int, critical: bool, expected_bytes: int) -> None:
        """OnStepBegin: the detector's verdict picks p; the budget is p times the expected bytes."""
        if step in self._steps:
            raise ValueError(f"step {step} has already begun")
        if expected_bytes < 0:
            raise ValueError(f"expected_bytes must be >= 0, got {expected_bytes}")
        p = self.policy.p_low if critical else self.policy.p_high
        exact = Fraction(str(p))
        self._steps[step] = StepEntry(
            p=p, budget=int(exact * expected_bytes), expected=expected_bytes, p_exact=exact
        )

    def complete_step(self, step: int) -> None:
        """OnAllReduceComplete: the step's budget closes and never reopens."""
        entry = self._steps.get(step)
        if entry is not None:
            entry.open = False

    def register_flow(
        self,
        flow_id: int,
        step: int | None = None,
        gradient: bool = False,
        keep_payload: bool | None = None,
        size: object = None,
    ) -> None:
        """StepOf and IsGradientAllReduce; exemption eligibility is fixed here, once.

        `keep_payload` overrides the policy's choice for this flow: a receiver that
        only counts bytes need not store them. `size`, where the receiving side knows
        it (the message it posted), is the flow's total: a packet that claims another
        total is rejected. Without it the first packet's total is taken.
        """
        if flow_id in self._flows:
            raise ValueError(f"flow {flow_id} is already registered")
        self._finished.pop(flow_id, None)  # the id names a new flow now
        # `size: object`, so that bad input reaches this check in the compiled build too
        total: int | None = None
        if size is not None:
            if not (isinstance(size, int) and 0 < size < 2**32):
                raise ValueError(f"flow size must be an integer in 1..2**32-1, got {size!r}")
            total = size
        entry = self._steps.get(step) if step is not None else None
        eligible = (
            self.policy.exemption and gradient and entry is not None and entry.open and entry.p > 0
        )
        keep = self.policy.keep_payload if keep_payload is None else keep_payload
        self._flows[flow_id] = RxFlow(
            flow_id,
            step,
            gradient,
            eligible,
            total=total,
            size_registered=total is not None,
            parts=[] if keep else None,
        )

    def forget_flow(self, flow_id: int) -> None:
        """Drop a flow's state; a finished one's total is kept (FINISHED_KEPT)."""
        flow = self._flows.pop(flow_id, None)
        if flow is None or not flow.complete:
            return
        finished = self._finished
        finished[flow_id] = flow.rcv_nxt
        if len(finished) > FINISHED_KEPT:
            del finished[next(iter(finished))]

    # -- inspection -----------------------------------------------------------

    def step_state(self, step: int) -> StepState | None:
        entry = self._steps.get(step)
        return None if entry is None else entry.state()

    def flow_state(self, flow_id: int) -> RxFlowState | None:
        flow = self._flows.get(flow_id)
        return None if flow is None else flow.state()

    def forgiven_bytes(self, flow_id: int) -> int:
        """`flow_state(flow_id).forgiven_bytes` without building the rest (0 for a flow it
        does not hold): the endpoint asks it around every trimmed header."""
        flow = self._flows.get(flow_id)
        return 0 if flow is None else flow.forgiven_bytes

    def flow_ranges(self, flow_id: int) -> list[tuple[int, int, str]]:
        """The scoreboard above rcv_nxt, with both Requested kinds shown as 'requested'."""
        names = {
            State.REQUESTED: "requested",
            State.OUTSTANDING: "requested",
            State.FORGIVEN: "forgiven",
            State.RECEIVED: "received",
        }
        return [(s, e, names[st]) for s, e, st in self._flows[flow_id].scoreboard]

    def forgiven_ranges(self, flow_id: int) -> list[tuple[int, int]]:
        """Every byte range of the flow forgiven so far, merged: the zero-filled bytes of its payload."""
        return [(s, e) for s, e, _ in self._flows[flow_id].forgiven]

    def take_completed(self) -> list[int]:
        done, self._completed = self._completed, []
        return done

    def payload(self, flow_id: int) -> bytes:
        """The flow's bytes as delivered, `total` of them; bytes forgiven or not (yet)
        received read as zeros."""
        flow = self._flows[flow_id]
        if flow.parts is None or flow.total is None:
            return b""
        self._settle_buffer(flow)
        parts = list(flow.parts)
        end = flow.buffered
        for start in sorted(flow.held):
            piece = flow.held[start]
            parts += (bytes(start - end), piece)
            end = start + len(piece)
        parts.append(bytes(flow.total - end))
        return b"".join(parts)

    # -- the notification point's timer ---------------------------------------

    def next_deadline(self) -> float | None:
        """When `poll` next has a CNP to send, or None."""
        due = self._cnp_due
        while due:
            flow = self._flows.get(due[0][1])
            if flow is not None and flow.cnp_pending and not flow.complete:
                return due[0][0]
            heapq.heappop(due)
        return None

    def poll(self, now: float) -> list[bytes]:
        """The CNPs whose interval has ended by `now`, for marks that arrived inside it.

        A flow that completed or was forgotten meanwhile gets none: it has nothing
        left to slow down."""
        out: list[bytes] = []
        due = self._cnp_due
        while due and due[0][0] <= now:
            _, flow_id = heapq.heappop(due)
            flow = self._flows.get(flow_id)
            if flow is None or not flow.cnp_pending:
                continue
            flow.cnp_pending = False
            if flow.complete:
                continue
            flow.last_cnp = now
            flow.cnps_sent += 1
            out.append(FTH_STRUCT.pack(_VO_CNP, 0, 0, flow_id, 0, 0))
        return out

    # -- the data path --------------------------------------------------------

    def receive(self, buf: bytes | bytearray | memoryview, ce: bool, now: float) -> list[bytes]:
        """One arriving FTH packet (DATA, possibly trimmed); returns ACK, NACK and CNP packets."""
        if len(buf) < FTH_LEN:
            self.rejected["short"] += 1
            return []
        vo, flags, length, flow_id, seq, aux = unpack_fth(buf)
        try:
            check_fields(vo >> 4, vo & 0x0F, flags, length, seq, aux, len(buf) - FTH_LEN)
        except MalformedPacket as exc:
            self.rejected[exc.reason] += 1
            return []
        if vo != _VO_DATA:
            # Receivers take DATA only; control for our own sends goes to the sender.
            self.rejected["not_data"] += 1
            return []
        counts = self._counts
        if flags & _TRIMMED:
            # Counted before the flow lookup: every trimmed header that reached this
            # host, including late ones for flows already finished and forgotten.
            counts["trimmed"] += 1
        flow = self._flows.get(flow_id)
        if flow is None:
            if self._finished.get(flow_id) == aux:
                # A resend of a flow finished and forgotten: everything is settled. The
                # step's entry is gone with it, so no ELIGIBLE or EXHAUSTED (Flags).
                counts["finished"] += 1
                return [FTH_STRUCT.pack(_VO_ACK, _ECE if ce else 0, length, flow_id, aux, seq)]
            self.rejected["unknown_flow"] += 1
            return []
        if flow.total is None:
            flow.total = aux
        elif flow.total != aux:
            # The range check above held against this packet's own total; against the
            # flow's it may not, so nothing of it is used.
            self.rejected["total_mismatch"] += 1
            return []

        replies: list[bytes] = []
        if ce:
            flow.ce_marks += 1
            last = flow.last_cnp
            interval = self.policy.cnp_interval
            if last is None or now - last >= interval:
                flow.last_cnp = now
                flow.cnps_sent += 1
                replies.append(FTH_STRUCT.pack(_VO_CNP, 0, 0, flow_id, 0, 0))
            elif self.policy.cnp_at_window_end and not flow.cnp_pending:
                flow.cnp_pending = True
                heapq.heappush(self._cnp_due, (last + interval, flow_id))
        end = seq + length
        if flags & _TRIMMED:
            flow.trims += 1
            replies.append(self._on_trimmed_header(flow, seq, end, ce))
        else:
            counts["data"] += 1
            self._on_data(flow, seq, end, buf, ce, replies)
        if not flow.complete and flow.rcv_nxt >= flow.total:
            flow.complete = True
            self._completed.append(flow_id)
        return replies

    def _on_data(
        self,
        flow: RxFlow,
        seq: int,
        end: int,
        buf: bytes | bytearray | memoryview,
        ce: bool,
        replies: list[bytes],
    ) -> None:
        """The arrival table's right-hand column: absent/Requested -> Received; settled stays."""
        entry = self._steps.get(flow.step) if flow.gradient and flow.step is not None else None
        if not flow.scoreboard and seq == flow.rcv_nxt:
            # The common case: in order, nothing pending above. Absent -> Received.
            fresh = [(seq, end)]
            flow.rcv_nxt = end
            newly, was_outstanding = end - seq, 0
        elif end <= flow.rcv_nxt:
            # Everything here is settled already: Received -> Received, ACK; a Forgiven
            # range keeps its state and the payload is discarded with no credit back.
            self._counts["duplicate"] += 1
            fresh, newly, was_outstanding = [], 0, 0
        else:
            fresh, newly, was_outstanding = [], 0, 0
            for s, e, state in flow.scoreboard.pieces(max(seq, flow.rcv_nxt), end):
                if state in SETTLED:
                    continue  # Received stays Received; Forgiven discards, no credit back
                if state is State.OUTSTANDING:
                    was_outstanding += e - s
                fresh.append((s, e))
                newly += e - s
                flow.scoreboard.assign(s, e, State.RECEIVED)
            flow.rcv_nxt = flow.scoreboard.pop_settled_prefix(flow.rcv_nxt)
            if not newly:
                self._counts["duplicate"] += 1
        if newly:
            flow.received_bytes += newly
            parts = flow.parts
            if parts is not None:
                for s, e in fresh:
                    off = FTH_LEN + s - seq
                    piece = bytes(buf[off : off + e - s])
                    if s == flow.buffered:
                        _keep(parts, piece)
                        flow.buffered = e
                    else:
                        flow.held[s] = piece
                        heapq.heappush(flow.held_starts, s)
                if flow.buffered < flow.rcv_nxt:
                    self._settle_buffer(flow)
            if entry is not None:
                # `received` counts distinct bytes once; bytes beyond what the step said
                # it would bring are kept out of vesting, so no sender can buy budget.
                room = entry.expected - entry.received - entry.forgiven
                credit = newly if newly <= room else max(room, 0)
                entry.received += credit
                entry.excess += newly - credit
                entry.outstanding -= was_outstanding
        replies.append(self._ack(flow, seq, end - seq, ce, entry))

    @staticmethod
    def _settle_buffer(flow: RxFlow) -> None:
        """Grow the contiguous parts up to rcv_nxt: held bytes move in, forgiven gaps
        become zeros.

        Memory follows the bytes settled, never the sequence numbers: the parts
        hold [0, rcv_nxt), everything received above it waits in `held`, so a packet
        far out in a long flow costs its own payload and no more.
        """
        parts, held, starts, upto = flow.parts, flow.held, flow.held_starts, flow.rcv_nxt
        assert parts is not None
        pos = flow.buffered
        while pos < upto:
            if starts and starts[0] == pos:
                heapq.heappop(starts)
                piece = held.pop(pos)
            else:
                piece = bytes((min(starts[0], upto) if starts else upto) - pos)
            _keep(parts, piece)
            pos += len(piece)
        flow.buffered = pos

    def _unsettled(self, flow: RxFlow, lo: int, hi: int) -> list[tuple[int, int, State | None]]:
        """Unsettled: the bytes of [lo, hi) at or above rcv_nxt neither Received nor Forgiven."""
        lo = max(lo, flow.rcv_nxt)
        if lo >= hi:
            return []
        return [p for p in flow.scoreboard.pieces(lo, hi) if p[2] not in SETTLED]

    def _flags(self, flow: RxFlow, entry: StepEntry | None) -> int:
        """Flags: exemption-eligible as fixed at creation; exhausted while the budget cannot
        cover what is forgiven, what is outstanding and one more packet."""
        if not flow.exemption_eligible or entry is None:
            return 0
        if entry.forgiven + entry.outstanding + PACKET_BYTES > entry.budget:
            return _ELIGIBLE | _EXHAUSTED
        return _ELIGIBLE

    def _ack(self, flow: RxFlow, lo: int, length: int, ce: bool, entry: StepEntry | None) -> bytes:
        flags = self._flags(flow, entry) | (_ECE if ce else 0)
        return FTH_STRUCT.pack(_VO_ACK, flags, length, flow.flow_id, flow.rcv_nxt, lo)

    def _repair(self, flow: RxFlow, lo: int, hi: int, entry: StepEntry | None) -> bytes:
        """Repair: mark only the unsettled bytes Requested, then request the whole range."""
        for s, e, state in self._unsettled(flow, lo, hi):
            if state is None:
                flow.scoreboard.assign(s, e, State.REQUESTED)
        return FTH_STRUCT.pack(
            _VO_NACK, self._flags(flow, entry), hi - lo, flow.flow_id, lo, flow.rcv_nxt
        )

    def _on_trimmed_header(self, flow: RxFlow, lo: int, hi: int, ce: bool) -> bytes:
        """OnTrimmedHeader, branch by branch."""
        entry = self._steps.get(flow.step) if flow.step is not None else None
        missing = self._unsettled(flow, lo, hi)
        # Nothing is missing after all: acknowledge, charge nothing.
        if not missing:
            return self._ack(flow, lo, hi - lo, ce, entry)
        # Only gradients are forgivable.
        if not flow.gradient:
            return self._repair(flow, lo, hi, None)
        # No loss budget is open for this step: nothing to charge.
        if entry is None or not entry.open:
            return self._repair(flow, lo, hi, entry)
        # A range trimmed again is already outstanding: count only its new bytes.
        length = 0
        for s, e, state in missing:
            length += e - s
            if state is not State.OUTSTANDING:
                entry.outstanding += e - s
                flow.scoreboard.assign(s, e, State.OUTSTANDING)
        if not self._may_forgive(entry, length):
            return self._repair(flow, lo, hi, entry)
        # A range the draw refuses charges nothing and stays outstanding.
        if not self._rng.random() < self.policy.forgive_prob:
            return self._repair(flow, lo, hi, entry)
        # Forgiving charges the loss budget once; Forgiven never changes again.
        entry.forgiven += length
        entry.outstanding -= length
        flow.forgiven_bytes += length
        for s, e, _ in missing:
            flow.scoreboard.assign(s, e, State.FORGIVEN)
            flow.forgiven.assign(s, e, State.FORGIVEN)
        flow.rcv_nxt = flow.scoreboard.pop_settled_prefix(flow.rcv_nxt)
        return self._ack(flow, lo, hi - lo, ce, entry)

    def _may_forgive(self, entry: StepEntry, length: int) -> bool:
        """The vesting rule, in exact integer arithmetic: forgiven + len <= p*(received +
        forgiven + len). The budget and the step's expected bytes bound it as well, so
        no sender that brings more than expected can push forgiven past the budget."""
        forgiven_after = entry.forgiven + length
        if forgiven_after > entry.budget:
            return False
        if entry.received + forgiven_after > entry.expected:
            return False
        if not self.policy.vesting:
            return True
        p = entry.p_exact
        return forgiven_after * p.denominator <= p.numerator * (entry.received + forgiven_after)


def _keep(parts: list[bytes | bytearray], piece: bytes) -> None:
    """Append a settled piece to a flow's parts; tiny pieces go into a packed bytearray, kept
    small enough that growing it stays cheap."""
    if len(piece) >= _PACK_BELOW:
        parts.append(piece)
        return
    last = parts[-1] if parts else None
    if isinstance(last, bytearray) and len(last) < _PACK_UPTO:
        last += piece
    else:
        parts.append(bytearray(piece))
