"""The FORGIVE sender: segmentation, pacing, selective repeat, RTO, congestion control and the
mode bit.

Congestion control is DCQCN (a rate per flow, cut by CNPs and NACKs) or NSCC (a window per
flow, driven by the ECN echo and round trip of every ACK and by NACKs), chosen by the
params the sender is built with; the exemption applies to whichever runs.

OnFlowStart, OnReport, OnCongestionNotification and OnRetransmissionRequest
from the note are `open_flow`, `_on_report`, `_on_cnp` and `_on_nack` here.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final

from common.wire import (
    FTH_LEN,
    FTH_STRUCT,
    FTH_VERSION,
    PACKET_BYTES,
    TRIMMED_FRAME_LEN,
    Flag,
    MalformedPacket,
    Opcode,
    check_fields,
    unpack_fth,
)
from host_agent.core.dcqcn import DcqcnParams, DcqcnRate, LineRate, NicDcqcnRate, new_rate
from host_agent.core.fields import FieldMapping
from host_agent.core.nscc import NsccParams, NsccWindow
from host_agent.core.scoreboard import AckedRanges

OBEYING: Final = "obeying"
EXEMPT: Final = "exempt"
_VO_DATA: Final = (FTH_VERSION << 4) | Opcode.DATA
_DATA, _ACK, _NACK = int(Opcode.DATA), int(Opcode.ACK), int(Opcode.NACK)
_ZEROS: Final = bytes(PACKET_BYTES)
_ELIGIBLE: Final = int(Flag.ELIGIBLE)
_EXHAUSTED: Final = int(Flag.EXHAUSTED)
_ECE: Final = int(Flag.ECE)
_RETX: Final = int(Flag.RETX)
_LAST: Final = int(Flag.LAST)
MAX_TIMEOUTS: Final = 15
"""Consecutive timeouts without progress after which a flow fails: Linux's default
for the same decision in TCP (net.ipv4.tcp_retries2 = 15)."""


@dataclass
class PathTiming:
    """RFC 6298 round-trip state for one peer, shared by every flow to it: a new flow then
    starts from what earlier flows measured instead of from the initial timeout."""

    rto: float
    srtt: float | None = None
    rttvar: float = 0.0
    rtt_min: float | None = None
    full_rtt_min: float | None = None
    """The shortest round trip of a full-size segment: NSCC's base round trip. A short
    segment's is shorter by serialisation, which on the scaled fabric is most of a round trip."""


class TxFlow:
    """One message being sent: its bytes, its reaction point, what is in flight, its counters.

    One is made per message (plain, not a dataclass: common.native)."""

    def __init__(
        self,
        flow_id: int,
        size: int,
        data: memoryview | None,
        rate: DcqcnRate | NicDcqcnRate | LineRate | NsccWindow,
        opened: float,
        *,
        path: PathTiming,
        rto: float,
        window_per_bps: float,
        cuts_at_open: int,
        mark_cuts_at_open: int,
        below_at_open: float = 0.0,
    ) -> None:
        self.flow_id = flow_id
        self.size = size
        self.data = data
        self.rate = rate
        self.opened = opened
        self.next_new: int = 0
        self.acked: AckedRanges = AckedRanges()
        self.retx: deque[tuple[int, int]] = deque()
        self.inflight: dict[int, tuple[int, float, bool]] = {}
        """Segment start -> (end, sent at, is a retransmission)."""
        self.sent_order: deque[tuple[float, int, int]] = deque()
        self.next_send_at: float = 0.0
        """When the next packet may leave: the gap after the last one is the bytes it still has
        to drain at `pace_rate`, re-timed whenever the rate changes before it ends."""
        self.pace_rate: float = 0.0
        """The rate the pending gap drains at (the rate when it was last timed)."""
        self.scheduled: bool = False
        self.wake_at: float = 0.0
        """The time of the flow's live entry on the send heap: its departure, or sooner the
        rate's next change before it."""
        self.rto_armed: bool = False
        self.cc_mode: str = OBEYING
        self.path = path
        self.rto = rto
        """The flow's current timeout: the path's, doubled per expiry until progress."""
        self.done: bool = False
        self.acked_bytes: int = 0
        self.sent_bytes: int = 0
        self.sent_packets: int = 0
        self.retransmitted_bytes: int = 0
        self.cnps: int = 0
        self.cnps_ignored: int = 0
        self.nacks: int = 0
        self.rtos: int = 0
        self.rtt_max: float = 0.0
        """The longest round trip sampled (segments sent once only)."""
        self.late_acks: int = 0
        """ACKs of a resent segment that came sooner after the resend than the path's shortest
        round trip: they answer an earlier copy, so that resend was not needed."""
        self.timeouts_in_a_row: int = 0
        """Timeout rounds since the last acknowledged byte; `max_timeouts` of them fail the flow."""
        self.round_ends: float = 0.0
        """Expiries before this time belong to the current timeout round. Each segment keeps its
        own timer, so the segments of one burst expire one after another; counted singly, a
        burst of 15 would fail a flow within one backed-off timeout of silence."""
        self.failed: bool = False
        self.stopped: bool = False
        """Done or failed: nothing more is sent and no timer runs."""
        self.mode_changes: int = 0
        self.exempt_since: float | None = None
        self.exempt_time: float = 0.0
        self.obeying_again_since: float | None = None
        self.obeying_again_time: float = 0.0
        """Time spent obeying congestion control after the flow's exemption first began."""
        self.finished: float | None = None
        self.window_blocked: bool = False
        """NSCC: the window was full when the flow's turn came; an ACK or NACK reschedules it."""
        self.window_per_bps = window_per_bps
        """The sender window over the line rate (0: no window): at rate r the flow may have
        r * window_per_bps new bytes unacknowledged (a window that shrinks with the rate, as
        ns-3's VAR_WIN)."""
        self.cuts_at_open = cuts_at_open
        self.mark_cuts_at_open = mark_cuts_at_open
        """The reaction point's counts when the flow opened: a QP's state outlives its flows."""
        self.below_at_open = below_at_open
        """The reaction point's time below the line rate when the flow opened."""

    def window_open(self) -> bool:
        """New data may go: no window, or fewer bytes past the cumulative ACK than it allows
        (always at least one packet, as ns-3's IsWinBound)."""
        return not self.window_per_bps or (
            self.next_new - self.acked.una < self.window_per_bps * self.rate.current
        )

    def has_work(self) -> bool:
        return bool(self.retx) or (self.next_new < self.size and self.window_open())

    def in_flight(self) -> int:
        """Bytes sent and neither acknowledged nor waiting to be resent: what a window holds.
        Derived from the flow's state rather than counted, so that it cannot drift."""
        waiting = sum(hi - lo for lo, hi in self.retx)
        return max(0, self.next_new - self.acked_bytes - waiting)

    def state(self) -> TxFlowState:
        rate = self.rate
        return TxFlowState(
            cc_mode=self.cc_mode,
            rate_bps=rate.current,
            alpha=rate.alpha,
            size=self.size,
            acked_bytes=self.acked_bytes,
            sent_bytes=self.sent_bytes,
            sent_packets=self.sent_packets,
            retransmitted_bytes=self.retransmitted_bytes,
            done=self.done,
            failed=self.failed,
            cnps=self.cnps,
            cnps_ignored=self.cnps_ignored,
            nacks=self.nacks,
            rtos=self.rtos,
            srtt=self.path.srtt,
            rtt_max=self.rtt_max,
            late_acks=self.late_acks,
            rto=self.rto,
            rate_cuts=rate.cuts_due - self.cuts_at_open,
            mark_cuts=rate.mark_cuts_due - self.mark_cuts_at_open,
            below_line_s=rate.below_line_s(
                self.finished if self.finished is not None else self.opened
            )
            - self.below_at_open,
            mode_changes=self.mode_changes,
            exempt_time=self.exempt_time,
            obeying_again_time=self.obeying_again_time,
            opened=self.opened,
            finished=self.finished,
            window=self.window_state(),
        )

    def window_state(self) -> WindowState | None:
        """NSCC's window, base round trip and smoothed queueing delay; None under DCQCN."""
        rate = self.rate
        if not isinstance(rate, NsccWindow):
            return None
        return WindowState(
            window_bytes=rate.window,
            max_window_bytes=rate.max_window,
            base_rtt=rate.base_rtt,
            avg_delay=rate.avg_delay,
        )


@dataclass(frozen=True)
class WindowState:
    """NSCC's window of a flow (TxFlowState.window)."""

    window_bytes: float
    max_window_bytes: float
    base_rtt: float
    avg_delay: float


@dataclass(frozen=True)
class TxFlowState(FieldMapping):
    """A sent flow as `flow_state` returns it."""

    cc_mode: str
    rate_bps: float
    alpha: float
    size: int
    acked_bytes: int
    sent_bytes: int
    sent_packets: int
    retransmitted_bytes: int
    done: bool
    failed: bool
    cnps: int
    cnps_ignored: int
    nacks: int
    rtos: int
    srtt: float | None
    rtt_max: float
    late_acks: int
    rto: float
    rate_cuts: int
    """Rate cuts due since the flow opened (its reaction point's, which a QP may share)."""
    mark_cuts: int
    """Of those, the ones that answered a mark."""
    below_line_s: float
    """Time the flow's reaction point spent below the line rate while it was open (until it
    finished; DCQCN only, 0 under NSCC)."""
    mode_changes: int
    exempt_time: float
    obeying_again_time: float
    opened: float
    finished: float | None
    window: WindowState | None


@dataclass(frozen=True)
class SenderCounts:
    """The sender's packet counters, as `stats` returns them: every rejection counts as
    malformed but an unknown or failed flow's."""

    malformed: int
    unknown_flow: int


class ForgiveSender:
    """Sans-IO sender: `poll(now)` returns the DATA packets due, `receive` takes feedback.

    The NIC is paced at the line rate and each flow at its DCQCN rate, or under NSCC at the
    line rate within its window; the retransmission timeout backs off exponentially per flow and resets on progress.
    After `max_timeouts` timeout rounds in a row with no byte acknowledged, a flow fails:
    it stops, `flow_state` says `failed`, and `take_failed` reports it once.

    Options beside DCQCN's (docs/dcqcn.md, "Sender options"): `window_bytes`, a window
    per flow at the line rate that shrinks with the flow's rate (0: none); `qp_state`,
    whether flows opened with the same `qp` key share one reaction point, so DCQCN's
    state outlives a message; `payload_bytes`, the most DATA bytes per packet.

    Every feedback packet it drops is counted once in `rejected`, by reason:
    "short", "bad_header", "not_control" (a DATA packet), "unknown_flow",
    "out_of_range" (a range past the flow's size) and "failed_flow".
    """

    def __init__(
        self,
        params: DcqcnParams | NsccParams,
        *,
        rto: float = 1e-3,
        rto_max: float = 0.2,
        max_timeouts: object = MAX_TIMEOUTS,  # object: checked below, compiled or not
        window_bytes: float = 0.0,
        qp_state: bool = False,
        payload_bytes: int = PACKET_BYTES,
        seed: object = 0,  # object: checked below, compiled or not
    ) -> None:
        # `seed` is in docs/protocol.md's constructor; the sender draws nothing at random
        # (its timing is the clock's and DCQCN's), so every seed gives the same sender.
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        if not (window_bytes >= 0 and math.isfinite(window_bytes)):
            raise ValueError(f"window_bytes must be a finite number >= 0, got {window_bytes}")
        if isinstance(payload_bytes, bool) or not 1 <= payload_bytes <= PACKET_BYTES:
            raise ValueError(f"payload_bytes must lie in 1..{PACKET_BYTES}, got {payload_bytes}")
        if rto <= 0 or rto_max < rto:
            raise ValueError(f"need 0 < rto <= rto_max, got rto={rto}, rto_max={rto_max}")
        if isinstance(max_timeouts, bool) or not isinstance(max_timeouts, int) or max_timeouts < 1:
            raise ValueError(f"max_timeouts must be an integer >= 1, got {max_timeouts!r}")
        self.params = params
        self._windowed = isinstance(params, NsccParams)
        self.rto = rto
        self.rto_max = rto_max
        self.max_timeouts = max_timeouts
        self.payload_bytes = payload_bytes
        self.qp_state = qp_state
        self._window_per_bps = window_bytes / params.line_rate_bps
        self._qps: dict[Hashable, DcqcnRate | NicDcqcnRate | LineRate] = {}
        """Reaction points by QP key, when `qp_state` keeps them across messages."""
        self._flows: dict[int, TxFlow] = {}
        self._paths: dict[Hashable, PathTiming] = {}
        self._send_heap: list[tuple[float, int]] = []
        self._rto_heap: list[tuple[float, int]] = []
        self._nic_free_at = 0.0
        self._bit_time = 8.0 / params.line_rate_bps
        self._completed: list[int] = []
        self._failed: list[int] = []
        self.rejected: Counter[str] = Counter()

    @property
    def stats(self) -> SenderCounts:
        rejected = self.rejected
        unknown = rejected["unknown_flow"]
        return SenderCounts(
            malformed=rejected.total() - unknown - rejected["failed_flow"], unknown_flow=unknown
        )

    # -- flows ---------------------------------------------------------------

    def open_flow(
        self,
        flow_id: int,
        size_bytes: int,
        now: float,
        data: bytes | memoryview | None = None,
        peer: Hashable = None,
        qp: Hashable = None,
    ) -> None:
        """OnFlowStart: every flow obeys congestion control until its first report.

        Flows to the same `peer` (any hashable, e.g. its address) share one
        round-trip estimate; flows without one share the sender's default path.
        With `qp_state`, flows with the same `qp` key (e.g. peer and traffic class) share
        one reaction point, as a NIC's QP keeps its DCQCN state from message to message;
        otherwise, or with no key, each flow starts at the line rate.
        """
        if flow_id in self._flows:
            raise ValueError(f"flow {flow_id} is already open")
        if not 0 < size_bytes < 2**32:
            raise ValueError(f"flow size must lie in 1..2**32-1, got {size_bytes}")
        if data is not None and len(data) != size_bytes:
            raise ValueError(f"data has {len(data)} bytes, flow size is {size_bytes}")
        path = self._paths.get(peer)
        if path is None:
            path = self._paths[peer] = PathTiming(self.rto)
        if isinstance(self.params, NsccParams):
            rate: DcqcnRate | NicDcqcnRate | LineRate | NsccWindow = NsccWindow(
                self.params, now, path.full_rtt_min
            )
        elif self.qp_state and qp is not None:
            rate = self._qps.get(qp)  # type: ignore[assignment]
            if rate is None:
                rate = self._qps[qp] = new_rate(self.params, now)
        else:
            rate = new_rate(self.params, now)
        flow = TxFlow(
            flow_id,
            size_bytes,
            memoryview(data) if data is not None else None,
            rate,
            opened=now,
            path=path,
            rto=path.rto,
            window_per_bps=self._window_per_bps,
            cuts_at_open=rate.cuts_due,
            mark_cuts_at_open=rate.mark_cuts_due,
            below_at_open=rate.below_line_s(now),
        )
        self._flows[flow_id] = flow
        self._schedule(flow, now)

    def close_flow(self, flow_id: int) -> None:
        self._flows.pop(flow_id, None)

    def flow_state(self, flow_id: int) -> TxFlowState | None:
        flow = self._flows.get(flow_id)
        return None if flow is None else flow.state()

    def take_completed(self) -> list[int]:
        done, self._completed = self._completed, []
        return done

    def take_failed(self) -> list[int]:
        """Flows that gave up since the last call, each reported once."""
        failed, self._failed = self._failed, []
        return failed

    # -- timing --------------------------------------------------------------

    def _schedule(self, flow: TxFlow, now: float) -> None:
        """Put the flow on the send heap: at its departure if it has work, and sooner if its
        rate may change before a pending departure, which is then re-timed (`_retime`).
        A flow already on the heap moves only to an earlier time."""
        if flow.stopped:
            return
        depart = flow.next_send_at
        if depart > now:
            wake = flow.rate.next_change(now)
            if wake >= depart:
                wake = depart if flow.has_work() else math.inf
        elif flow.has_work():
            wake = flow.next_send_at = now
        else:
            return
        if wake == math.inf or (flow.scheduled and wake >= flow.wake_at):
            return
        flow.scheduled = True
        flow.wake_at = wake
        heapq.heappush(self._send_heap, (wake, flow.flow_id))

    @staticmethod
    def _retime(flow: TxFlow, now: float) -> None:
        """The rate changed during the gap before the next departure: what is left of the gap
        is bytes still to drain, now at the new rate (as a NIC's pacer does, and ns-3's
        RdmaHw::ChangeRate moves a QP's next send time)."""
        depart = flow.next_send_at
        if depart <= now:
            return
        rate = flow.rate.rate_at(now)
        if rate != flow.pace_rate:
            flow.next_send_at = now + (depart - now) * flow.pace_rate / rate
            flow.pace_rate = rate

    def next_deadline(self) -> float | None:
        """The earliest time at which `poll` has a packet to send or a timer to fire."""
        best = None
        while self._send_heap:
            t, fid = self._send_heap[0]
            flow = self._flows.get(fid)
            if flow is None or not flow.scheduled or flow.wake_at != t:
                heapq.heappop(self._send_heap)
                continue
            best = max(t, self._nic_free_at)
            break
        while self._rto_heap:
            t, fid = self._rto_heap[0]
            flow = self._flows.get(fid)
            if flow is None or flow.stopped:
                heapq.heappop(self._rto_heap)
                continue
            best = t if best is None else min(best, t)
            break
        return best

    def poll(self, now: float) -> list[bytes]:
        """Fire due retransmission timeouts, then emit every DATA packet due by `now`."""
        while self._rto_heap and self._rto_heap[0][0] <= now:
            _, fid = heapq.heappop(self._rto_heap)
            flow = self._flows.get(fid)
            if flow is not None and not flow.stopped:
                flow.rto_armed = False
                self._check_rto(flow, now)
        out: list[bytes] = []
        heap = self._send_heap
        while heap and heap[0][0] <= now and self._nic_free_at <= now:
            t, fid = heapq.heappop(heap)
            flow = self._flows.get(fid)
            if flow is None or not flow.scheduled or flow.wake_at != t:
                continue
            flow.scheduled = False
            if t < flow.next_send_at:  # the rate may have changed during the gap
                self._retime(flow, now)
                self._schedule(flow, now)
                continue
            if self._windowed and flow.in_flight() + PACKET_BYTES > flow.rate.window:  # type: ignore[union-attr]
                flow.window_blocked = True
                continue
            packet = self._next_packet(flow, now)
            if packet is None:
                continue
            wire = len(packet) - FTH_LEN + TRIMMED_FRAME_LEN
            self._nic_free_at = max(self._nic_free_at, now - wire * self._bit_time) + (
                wire * self._bit_time
            )
            rate = flow.pace_rate = flow.rate.rate_at(now)
            gap = wire * 8.0 / rate
            # Pace from the scheduled time, but never bank more than one packet of credit.
            flow.next_send_at = max(t, now - gap) + gap
            flow.rate.on_sent(wire, now)
            if flow.rate.current != rate:  # the byte counter raised it
                self._retime(flow, now)
            out.append(packet)
            self._schedule(flow, now)
        return out

    def _next_packet(self, flow: TxFlow, now: float) -> bytes | None:
        """Selective repeat: requested or timed-out ranges first, then new data."""
        flags = 0
        while flow.retx:
            lo, hi = flow.retx[0]
            gap = flow.acked.first_gap(lo, hi)
            if gap is None:
                flow.retx.popleft()
                continue
            lo = gap[0]
            hi = min(gap[1], lo + self.payload_bytes)
            if hi >= flow.retx[0][1]:
                flow.retx.popleft()
            else:
                flow.retx[0] = (hi, flow.retx[0][1])
            flags = _RETX
            flow.retransmitted_bytes += hi - lo
            break
        else:
            if flow.next_new >= flow.size or not flow.window_open():
                return None
            lo = flow.next_new
            hi = min(lo + self.payload_bytes, flow.size)
            flow.next_new = hi
        if hi == flow.size:
            flags |= _LAST
        flow.sent_bytes += hi - lo
        flow.sent_packets += 1
        flow.sent_order.append((now, lo, hi))
        flow.inflight[lo] = (hi, now, flags & _RETX != 0)
        if not flow.rto_armed:
            flow.rto_armed = True
            heapq.heappush(self._rto_heap, (now + flow.rto, flow.flow_id))
        payload = flow.data[lo:hi] if flow.data is not None else _ZEROS[: hi - lo]
        return FTH_STRUCT.pack(_VO_DATA, flags, hi - lo, flow.flow_id, lo, flow.size) + payload

    def _check_rto(self, flow: TxFlow, now: float) -> None:
        """Resend only the segments whose timer expired; back off once per expiry, and
        count toward giving up once per round."""
        order = flow.sent_order
        expired = False
        while order:
            sent_at, lo, hi = order[0]
            live = flow.inflight.get(lo)
            current = live is not None and live[0] == hi and live[1] == sent_at
            if not current or flow.acked.first_gap(lo, hi) is None:
                order.popleft()
                if current:
                    del flow.inflight[lo]
                continue
            if sent_at + flow.rto > now:
                break
            order.popleft()
            del flow.inflight[lo]
            flow.retx.append((lo, hi))
            expired = True
        if expired:
            flow.rtos += 1
            flow.rto = min(flow.rto * 2, self.rto_max)
            if now >= flow.round_ends:
                flow.timeouts_in_a_row += 1
                if flow.timeouts_in_a_row >= self.max_timeouts:
                    self._fail(flow, now)
                    return
                flow.round_ends = now + flow.rto
            self._schedule(flow, now)
        if order:
            flow.rto_armed = True
            heapq.heappush(self._rto_heap, (order[0][0] + flow.rto, flow.flow_id))

    def _fail(self, flow: TxFlow, now: float) -> None:
        """Give up: the receiver has acknowledged nothing through `max_timeouts` timeouts."""
        flow.failed = True
        self._stop(flow, now)
        flow.scheduled = False
        self._failed.append(flow.flow_id)

    def _stop(self, flow: TxFlow, now: float) -> None:
        """The flow is done or has failed: nothing more is sent or resent, no timer runs for
        it, and its exemption clock stops."""
        flow.stopped = True
        flow.finished = now
        self._end_exemption_clock(flow, now)
        flow.retx.clear()
        flow.inflight.clear()
        flow.sent_order.clear()

    @staticmethod
    def _end_exemption_clock(flow: TxFlow, now: float) -> None:
        """Stop whichever clock runs: time exempt, or time obeying again after an exemption."""
        if flow.exempt_since is not None:
            flow.exempt_time += now - flow.exempt_since
            flow.exempt_since = None
        if flow.obeying_again_since is not None:
            flow.obeying_again_time += now - flow.obeying_again_since
            flow.obeying_again_since = None

    # -- feedback --------------------------------------------------------------

    def receive(self, buf: bytes | bytearray | memoryview, now: float) -> None:
        """An ACK, NACK or CNP for one of our flows. Anything else is counted and dropped."""
        if len(buf) < FTH_LEN:
            self.rejected["short"] += 1
            return
        vo, flags, length, flow_id, seq, aux = unpack_fth(buf)
        opcode = vo & 0x0F
        try:
            check_fields(vo >> 4, opcode, flags, length, seq, aux, len(buf) - FTH_LEN)
        except MalformedPacket as exc:
            self.rejected[exc.reason] += 1
            return
        if opcode == _DATA:
            self.rejected["not_control"] += 1
            return
        flow = self._flows.get(flow_id)
        if flow is None:
            self.rejected["unknown_flow"] += 1
            return
        if flow.failed:
            self.rejected["failed_flow"] += 1
            return
        if opcode == _ACK:
            # rcv_nxt in seq, the selective range [aux, aux + length)
            if seq > flow.size or aux + length > flow.size:
                self.rejected["out_of_range"] += 1
                return
            self._on_report(flow, flags, now)
            self._on_ack(flow, seq, aux, length, now, bool(flags & _ECE))
        elif opcode == _NACK:
            # the requested range [seq, seq + length), rcv_nxt in aux
            if aux > flow.size or seq + length > flow.size:
                self.rejected["out_of_range"] += 1
                return
            self._on_report(flow, flags, now)
            self._on_nack(flow, seq, length, aux, now)
        else:
            self._on_cnp(flow, now)

    def _on_report(self, flow: TxFlow, flags: int, now: float) -> None:
        """OnReport: the latest report wins; eligible and not exhausted means exempt.

        The ECN echo on the report that ends an exemption is then applied as a
        congestion notification: the receiver's CNP for the same mark went out before
        that report and found the flow still exempt, and the note keeps the echo so
        the signal is still there once the flow obeys again. While a flow obeys
        throughout, CNPs alone cut its rate, so no mark counts twice. Under NSCC the echo
        is the signal itself: the ACK or NACK that carries it is applied next, obeying.
        """
        mode = EXEMPT if flags & _ELIGIBLE and not flags & _EXHAUSTED else OBEYING
        if mode != flow.cc_mode:
            flow.mode_changes += 1
            flow.cc_mode = mode
            self._end_exemption_clock(flow, now)
            if mode == EXEMPT:
                flow.exempt_since = now
            else:
                flow.obeying_again_since = now
                if flags & _ECE and not self._windowed:
                    self._reduce(flow, now, mark=True)

    def _settle(self, flow: TxFlow, lo: int, hi: int, now: float) -> int:
        """Record [lo, hi) as acknowledged; returns the bytes of it that were not yet."""
        fresh = flow.acked.add(lo, hi)
        if fresh:
            flow.acked_bytes += fresh
            flow.rto = flow.path.rto
            flow.timeouts_in_a_row = 0
            flow.round_ends = 0.0
            if flow.acked.una >= flow.size and not flow.done:
                flow.done = True
                self._stop(flow, now)
                self._completed.append(flow.flow_id)
        return fresh

    def _sample_rtt(self, flow: TxFlow, rtt: float) -> None:
        """RFC 6298's estimator; `rto` is both the initial and the smallest timeout."""
        path = flow.path
        flow.rtt_max = max(flow.rtt_max, rtt)
        path.rtt_min = rtt if path.rtt_min is None else min(path.rtt_min, rtt)
        if path.srtt is None:
            path.srtt, path.rttvar = rtt, rtt / 2
        else:
            path.rttvar = 0.75 * path.rttvar + 0.25 * abs(path.srtt - rtt)
            path.srtt = 0.875 * path.srtt + 0.125 * rtt
        path.rto = min(max(self.rto, path.srtt + 4 * path.rttvar), self.rto_max)

    def _on_ack(
        self, flow: TxFlow, rcv_nxt: int, lo: int, length: int, now: float, marked: bool = False
    ) -> None:
        segment = flow.inflight.get(lo) if length else None
        rtt = None
        if segment is not None and segment[0] == lo + length:
            age = now - segment[1]
            if not segment[2]:
                # Karn: only a segment sent once gives an unambiguous sample.
                rtt = age
                self._sample_rtt(flow, age)
            elif flow.path.rtt_min is not None and age < flow.path.rtt_min:
                flow.late_acks += 1
        # The ACK that completes the flow is still the window's sample, as uet-htsim's
        # last ACK is: a flow of n packets gives n round trips, not n - 1, and its last
        # full-size one may lower the path's base for the flows after it.
        stopped = flow.stopped
        fresh = self._settle(flow, 0, rcv_nxt, now)
        if length:
            fresh += self._settle(flow, lo, lo + length, now)
        order = flow.sent_order
        while order and order[0][2] <= flow.acked.una:
            _, seg_lo, _ = order.popleft()
            flow.inflight.pop(seg_lo, None)
        if self._windowed and not stopped:
            window: NsccWindow = flow.rate  # type: ignore[assignment]
            full = length == PACKET_BYTES
            if full and rtt is not None:
                path = flow.path
                path.full_rtt_min = (
                    rtt if path.full_rtt_min is None else min(path.full_rtt_min, rtt)
                )
            react = flow.cc_mode == OBEYING
            window.on_ack(fresh, rtt, marked, flow.in_flight(), now, react=react, full=full)
            self._unblock(flow, now)
        if flow.window_per_bps and not flow.scheduled:
            self._schedule(flow, now)  # the window may have opened

    def _unblock(self, flow: TxFlow, now: float) -> None:
        """A window that was full may have room again."""
        if flow.window_blocked:
            flow.window_blocked = False
            self._schedule(flow, now)

    def _on_nack(self, flow: TxFlow, lo: int, length: int, rcv_nxt: int, now: float) -> None:
        """OnRetransmissionRequest: the report is applied already; a NACK cuts the rate
        only while obeying, and the requested range is resent."""
        flow.nacks += 1
        self._settle(flow, 0, rcv_nxt, now)
        if flow.done:
            return
        hi = min(lo + length, flow.size)
        segment = flow.inflight.get(lo)
        if flow.cc_mode == OBEYING:
            if self._windowed:
                full = segment is not None and segment[0] == hi == lo + PACKET_BYTES
                rtt = now - segment[1] if full and not segment[2] else None  # type: ignore[index]
                nacked = max(0, hi - lo)  # out of flight from now: it waits to be resent
                window: NsccWindow = flow.rate  # type: ignore[assignment]
                window.on_nack(nacked, rtt, max(0, flow.in_flight() - nacked), now)
            else:
                self._reduce(flow, now, mark=False)
        if lo >= hi:
            self._unblock(flow, now)
            return
        flow.window_blocked = False
        # The requested segment is being resent now, so its own timer no longer applies.
        flow.inflight.pop(lo, None)
        flow.retx.append((lo, hi))
        self._schedule(flow, now)

    def _on_cnp(self, flow: TxFlow, now: float) -> None:
        """OnCongestionNotification: an exempt sender ignores ECN marks as well as trims."""
        flow.cnps += 1
        if flow.cc_mode == EXEMPT:
            flow.cnps_ignored += 1
            return
        if not self._windowed:  # NSCC reads the same mark from the ACK's echo instead
            self._reduce(flow, now, mark=True)

    def _reduce(self, flow: TxFlow, now: float, mark: bool) -> None:
        """ReduceRate for an ECN mark (`mark`) or a trim: a cut now, or one due at the
        profile's next check; either way the pending departure follows the rate."""
        flow.rate.reduce(now, mark)  # type: ignore[union-attr]
        self._retime(flow, now)
        self._schedule(flow, now)
