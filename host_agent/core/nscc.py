"""NSCC, Ultra Ethernet's sender-based congestion control, as a per-flow congestion window.

The equations are those of the Ultra Ethernet Consortium's reference simulator
(ultraethernet/uet-htsim, `htsim/sim/uec.cpp`: `UecSrc::initNsccParams`,
`updateCwndOnAck_NSCC`, `updateCwndOnNack_NSCC`, `quick_adapt`, `fair_increase`,
`proportional_increase`, `fast_increase`, `multiplicative_decrease`,
`fulfill_adjustment`, `update_delay`, `update_base_rtt`); docs/nscc.md states them and
says where this module departs from that code. In short, every ACK carries one
round-trip sample and the ECN echo of the packet it answers, and with the queueing
delay d = rtt - base_rtt against a target delay:

- unmarked, d >= target: fair increase, a fixed amount per byte acknowledged;
- unmarked, d < target: proportional increase, more the further d is below the
  target (fast increase, a fixed fraction of each acknowledged byte added at once,
  while d stays under 1 us for a whole window);
- marked, d >= target: multiplicative decrease by the smoothed delay's excess over
  the target, at most once per base round trip and never below half;
- marked, d < target: nothing (the mark is taken as a path's, not the flow's, problem);
- quick adapt: once per base RTT + target, after a loss (a NACK) or a delay above
  four targets, a window that delivered less than an eighth of the maximum is cut to
  what it delivered.

Increases accumulate and are applied as inc / cwnd every 8 packets acknowledged or
every network round trip, with a small additive term once per round trip.

Each constant is stated for one reference link (`reference_rate_bps`, the note's
400 Gbps host link, over a network whose unloaded round trip is `network_rtt_s`) and
scaled to the emulated link by the rule DcqcnParams follows (runplan/scaling.py):
every period is multiplied by `time_scale`, every byte quantity by
line_rate / reference_rate * time_scale. The window itself is sized from the round
trips the flow measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from common.wire import DATA_FRAME_LEN, PACKET_BYTES

DEFAULT_CONTROL = "dcqcn"
"""The congestion control every sender runs unless told otherwise (`--cc`)."""
CONTROLS = (DEFAULT_CONTROL, "nscc")
"""The congestion controls a sender can run (`--cc`): DCQCN (its profile chosen by
`--dcqcn`) or NSCC."""

NSCC_VALUES: dict[str, Any] = {
    # uet-htsim initNsccParams: a reference network of 100 Gbps and 12 us against which
    # scaling_factor_a = BDP / reference BDP; target_Qdelay 0.75 x the network RTT when
    # switches trim; fi = 5 MSS a, eta = 0.15 MSS a, fi_scale = 0.25 a,
    # alpha = 4 MSS a b / target with b = target / 12 us; gamma 0.8; delay EWMA gain
    # 0.0125; quick adapt gated at maxwnd >> 3 and triggered above 4 x target; the
    # window bounded by one MTU and 1.5 BDP (initNscc); adjustments every 8 MTU
    # acknowledged or every network RTT; fast increase under 1 us of queueing delay.
    "reference_rate_bps": 400e9,
    # The note's fabric: four 1 us links each way between hosts on different leaves,
    # plus a full frame's and an ACK's serialisation at 400 Gbps on each of the four
    # hops (as uet-htsim's calculate_rtt adds them). uet-htsim's 400 Gbps leaf-spine has
    # the same four 1 us hops.
    "network_rtt_s": 2 * 4 * 1e-6 + 4 * (DATA_FRAME_LEN + 66) * 8 / 400e9,
    "base_rate_bps": 100e9,
    "base_rtt_s": 12e-6,
    "target_fraction": 0.75,
    "mss_bytes": PACKET_BYTES,
    "fair_increase_mss": 5.0,
    "eta_mss": 0.15,
    "fast_increase_fraction": 0.25,
    "proportional_mss": 4.0,
    "gamma": 0.8,
    "delay_gain": 0.0125,
    "qa_gate_shift": 3,
    "qa_threshold_targets": 4.0,
    "max_window_bdp": 1.5,
    "adjust_mtus": 8,
    "fast_increase_delay_s": 1e-6,
}
"""The profile's constants, by NsccParams field name."""


@dataclass(frozen=True)
class NsccParams:
    """NSCC's constants for one link and clock. Fields left None take NSCC_VALUES' value."""

    line_rate_bps: float
    time_scale: float = 1.0
    reference_rate_bps: float = None  # type: ignore[assignment]
    network_rtt_s: float = None  # type: ignore[assignment]
    base_rate_bps: float = None  # type: ignore[assignment]
    base_rtt_s: float = None  # type: ignore[assignment]
    target_fraction: float = None  # type: ignore[assignment]
    mss_bytes: int = None  # type: ignore[assignment]
    fair_increase_mss: float = None  # type: ignore[assignment]
    eta_mss: float = None  # type: ignore[assignment]
    fast_increase_fraction: float = None  # type: ignore[assignment]
    proportional_mss: float = None  # type: ignore[assignment]
    gamma: float = None  # type: ignore[assignment]
    delay_gain: float = None  # type: ignore[assignment]
    qa_gate_shift: int = None  # type: ignore[assignment]
    qa_threshold_targets: float = None  # type: ignore[assignment]
    max_window_bdp: float = None  # type: ignore[assignment]
    adjust_mtus: int = None  # type: ignore[assignment]
    fast_increase_delay_s: float = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) is None:
                object.__setattr__(self, f.name, NSCC_VALUES[f.name])
        for name in ("line_rate_bps", "time_scale", "network_rtt_s", "base_rtt_s", "mss_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.target_fraction <= 1:
            raise ValueError(f"target_fraction must lie in (0, 1], got {self.target_fraction}")
        if not 0 < self.gamma < 1 or not 0 < self.delay_gain < 1:
            raise ValueError("gamma and delay_gain must lie in (0, 1)")
        if self.max_window_bdp <= 0 or self.qa_gate_shift < 0 or self.adjust_mtus < 1:
            raise ValueError("need max_window_bdp > 0, qa_gate_shift >= 0, adjust_mtus >= 1")

    @classmethod
    def for_link(cls, line_rate_bps: float, time_scale: float = 1.0) -> NsccParams:
        """What a command line's `--cc nscc` builds for a host's link and clock."""
        return cls(line_rate_bps=line_rate_bps, time_scale=time_scale)

    # Scaled views, the same rule as DcqcnParams'.
    def period(self, seconds: float) -> float:
        return seconds * self.time_scale

    def bytes_(self, nbytes: float) -> float:
        return nbytes * self.line_rate_bps / self.reference_rate_bps * self.time_scale

    @property
    def scaling_a(self) -> float:
        """BDP of the network over the reference network's (uet-htsim's scaling_factor_a)."""
        return (self.network_rtt_s * self.reference_rate_bps) / (
            self.base_rtt_s * self.base_rate_bps
        )

    @property
    def network_rtt(self) -> float:
        return self.period(self.network_rtt_s)

    @property
    def target_delay(self) -> float:
        return self.period(self.target_fraction * self.network_rtt_s)

    @property
    def mss(self) -> float:
        """The unit of the increases, in the emulation's bytes."""
        return self.bytes_(self.mss_bytes)

    @property
    def fair_increase(self) -> float:
        return self.fair_increase_mss * self.mss * self.scaling_a

    @property
    def eta(self) -> float:
        return self.eta_mss * self.mss * self.scaling_a

    @property
    def fast_increase_scale(self) -> float:
        return self.fast_increase_fraction * self.scaling_a

    @property
    def proportional_gain(self) -> float:
        """alpha = 4 MSS a b / target, b = target / reference RTT: bytes per second of delay
        below the target."""
        return self.proportional_mss * self.mss * self.scaling_a / self.period(self.base_rtt_s)

    @property
    def qa_threshold(self) -> float:
        return self.qa_threshold_targets * self.target_delay

    @property
    def adjust_bytes(self) -> float:
        return self.adjust_mtus * self.mss

    @property
    def fast_increase_delay(self) -> float:
        return self.period(self.fast_increase_delay_s)

    def max_window(self, base_rtt: float) -> float:
        """1.5 BDP of a path with this base round trip, at the line rate; at least one packet."""
        return max(self.max_window_bdp * base_rtt * self.line_rate_bps / 8, PACKET_BYTES)


class NsccWindow:
    """One flow's NSCC state. The sender asks `window` how many bytes may be in flight.

    It answers the sender's rate calls as DcqcnRate does (`rate_at`, `next_change`,
    `on_sent`, `current`, `alpha`, `cuts_due`, `mark_cuts_due`): the flow is paced at the
    line rate and held by its window instead. `cuts` counts every decrease
    (multiplicative, quick adapt and NACK), `mark_cuts` the multiplicative ones, which
    answer ECN marks; `alpha` reports the smoothed queueing delay over the target.
    """

    __slots__ = (
        "_achieved",
        "_bytes_ignored",
        "_bytes_to_ignore",
        "_fi_count",
        "_inc",
        "_increasing",
        "_last_adjust",
        "_last_decrease",
        "_measured",
        "_qa_end",
        "_received",
        "_trigger_qa",
        "avg_delay",
        "base_rtt",
        "current",
        "cuts",
        "mark_cuts",
        "max_window",
        "params",
        "window",
    )

    def __init__(self, params: NsccParams, now: float, base_rtt: float | None = None) -> None:
        """`base_rtt`: a round trip other flows on the same path measured, if any."""
        self.params = params
        self.current = params.line_rate_bps
        self._measured = base_rtt is not None
        self.base_rtt = base_rtt if base_rtt is not None else params.network_rtt
        self.max_window = params.max_window(self.base_rtt)
        self.window = self.max_window
        self.avg_delay = 0.0
        self.cuts = 0
        self.mark_cuts = 0
        self._achieved = 0.0
        self._received = 0.0
        self._inc = 0.0
        self._bytes_ignored = 0.0
        self._bytes_to_ignore = 0.0
        self._trigger_qa = False
        self._qa_end: float | None = None
        self._fi_count = 0.0
        self._increasing = False
        self._last_decrease = -math.inf
        self._last_adjust = now

    # -- the DCQCN-shaped half of the interface ------------------------------------------

    @property
    def alpha(self) -> float:
        return self.avg_delay / self.params.target_delay

    @property
    def cuts_due(self) -> int:
        return self.cuts

    @property
    def mark_cuts_due(self) -> int:
        return self.mark_cuts

    def below_line_s(self, at: float) -> float:
        """NSCC paces at the line rate and holds a flow by its window: never below it."""
        return 0.0

    def rate_at(self, now: float) -> float:
        return self.current

    def next_change(self, now: float) -> float:
        """Never: the pace is the line rate; the window, not the rate, moves."""
        return math.inf

    def on_sent(self, nbytes: int, now: float) -> None:
        """Nothing: the window counts bytes acknowledged, not bytes sent."""

    # -- measurements ----------------------------------------------------------------------

    def _sample_base(self, rtt: float) -> None:
        """The shortest round trip of a full-size packet is the base. The first sample
        replaces the configured guess even when longer: the emulation's packets are not
        scaled, so its shortest round trip can exceed the scaled network's."""
        if not self._measured or rtt < self.base_rtt:
            self._measured = True
            self.base_rtt = rtt
            self.max_window = self.params.max_window(rtt)

    def _smooth_delay(self, delay: float, marked: bool) -> None:
        """The delay EWMA: an unmarked sample above the target is taken as a quarter of the
        base round trip (the queue it saw is not this flow's to answer for)."""
        gain = self.params.delay_gain
        if not marked and delay > self.params.target_delay:
            delay = self.base_rtt / 4
        self.avg_delay = gain * delay + (1 - gain) * self.avg_delay

    # -- the reactions --------------------------------------------------------------------

    def on_ack(
        self,
        newly_acked: int,
        rtt: float | None,
        marked: bool,
        in_flight: int,
        now: float,
        *,
        react: bool = True,
        full: bool = True,
    ) -> None:
        """One ACK: `newly_acked` bytes, the round trip of the segment it answers (None when
        that is ambiguous), its ECN echo. `react` False (an exempt flow) keeps measuring but
        takes the ACK as unmarked with no queueing delay. `full` False: the segment was
        shorter than a packet, so its round trip says nothing of the base."""
        self._achieved += newly_acked
        self._received += newly_acked
        self._bytes_ignored += newly_acked
        if rtt is not None and full:
            self._sample_base(rtt)
        if rtt is not None and rtt >= self.base_rtt:
            delay = rtt - self.base_rtt
            self._smooth_delay(delay, marked)
        else:
            delay = self.avg_delay
        if not react:
            marked, delay = False, 0.0
        if self._quick_adapt(False, marked, delay, in_flight, now):
            return
        p = self.params
        if not marked:
            if delay >= p.target_delay:
                self._inc += p.fair_increase * newly_acked
            elif not self._fast_increase(newly_acked, delay):
                self._inc += p.proportional_gain * newly_acked * (p.target_delay - delay)
        elif delay >= p.target_delay:
            self._multiplicative_decrease(now)
        self._bound()
        if self._received > p.adjust_bytes or now - self._last_adjust > p.network_rtt:
            self._apply_increase(now)
            self._bound()

    def on_nack(self, nbytes: int, rtt: float | None, in_flight: int, now: float) -> None:
        """A trimmed packet came back as a NACK: loss. `rtt`, that of a full-size packet sent
        once (else None), may lower the base. The delay EWMA takes one network round trip
        of queueing (the trim threshold's estimate), quick adapt is armed, and unless it
        fires now the window loses the bytes trimmed."""
        if rtt is not None:
            self._sample_base(rtt)
        self._bytes_ignored += nbytes
        self._smooth_delay(self.params.network_rtt, True)
        self._trigger_qa = True
        if self._quick_adapt(True, True, 0.0, in_flight, now):
            return
        self.window -= nbytes
        self.cuts += 1
        self._bound()

    def _quick_adapt(
        self, loss: bool, marked: bool, delay: float, in_flight: int, now: float
    ) -> bool:
        """True when this ACK's reaction is quick adapt's (a cut, or the ACKs of what was in
        flight at the cut, which are ignored)."""
        done = False
        p = self.params
        if marked and self._bytes_ignored < self._bytes_to_ignore:
            done = True
        elif self._qa_end is None or now > self._qa_end:
            if (
                self._qa_end is not None
                and (self._trigger_qa or loss or delay > p.qa_threshold)
                and self._achieved < self.max_window / (1 << p.qa_gate_shift)
            ):
                self.window = max(self._achieved, PACKET_BYTES)
                self.cuts += 1
                self._bytes_to_ignore = in_flight
                self._bytes_ignored = 0.0
                self._trigger_qa = False
                done = True
            self._achieved = 0.0
            self._qa_end = now + self.base_rtt + p.target_delay
        if done:
            self._inc = 0.0
            self._received = 0.0
        return done

    def _fast_increase(self, newly_acked: int, delay: float) -> bool:
        """Under 1 us of delay for a whole window's bytes: grow by a fraction of each byte."""
        if delay < self.params.fast_increase_delay:
            self._fi_count += newly_acked
            if self._fi_count > self.window or self._increasing:
                self.window += newly_acked * self.params.fast_increase_scale
                self._increasing = True
                return True
        else:
            self._fi_count = 0.0
        self._increasing = False
        return False

    def _multiplicative_decrease(self, now: float) -> None:
        self._increasing = False
        self._fi_count = 0.0
        avg, target = self.avg_delay, self.params.target_delay
        if avg > target and now - self._last_decrease > self.base_rtt:
            self.window *= max(1 - self.params.gamma * (avg - target) / avg, 0.5)
            self.window = max(self.window, PACKET_BYTES)
            self.cuts += 1
            self.mark_cuts += 1
            self._last_decrease = now

    def _apply_increase(self, now: float) -> None:
        self.window += self._inc / self.window
        if now - self._last_adjust >= self.params.network_rtt:
            self.window += self.params.eta
            self._last_adjust = now
        self._inc = 0.0
        self._received = 0.0

    def _bound(self) -> None:
        self.window = min(max(self.window, PACKET_BYTES), self.max_window)
