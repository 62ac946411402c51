"""DCQCN's reaction point: the per-flow sending rate that CNPs and retransmission requests cut.

Two profiles, because the note's figures came from one DCQCN and the paper
describes another (docs/dcqcn.md compares them):

- "paper" follows the DCQCN paper (Zhu et al., "Congestion Control for
  Large-Scale RDMA Deployments", SIGCOMM 2015): every CNP updates alpha and cuts
  at once, the target drops to the current rate on every cut, and increase
  events come from a timer and a byte counter.
- "nic" follows the Mellanox-style DCQCN that ASTRA-sim's packet-level backend
  runs (astra-network-ns3, `src/point-to-point/model/rdma-hw.cc`, the functions
  named `...Mlx`, with the values of `scratch/config/config.txt`): alpha is
  sampled every microsecond, cuts are checked every 4 microseconds, the target
  survives back-to-back cuts, and increase events come from the timer alone.

Each profile's constants describe one reference link (`reference_rate_bps`).
Rate-valued constants are applied as the same fraction of `line_rate_bps`;
`time_scale` says how many times slower the emulation's clock runs than the
fabric it stands for, and multiplies every period; the paper's byte counter is
the bytes the link sends in the same time, so it scales with both. This is the
emulation's one scaling rule (runplan/scaling.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Final

from mypy_extensions import mypyc_attr

DEFAULT_PROFILE: Final = "paper"
"""The profile every host runs unless told otherwise (`--dcqcn`)."""
OFF: Final = "off"
"""The profile of congestion control off: the reaction point never cuts."""
PROFILES: Final = (DEFAULT_PROFILE, "nic", OFF)

_PAPER: Final[dict[str, Any]] = {
    # Zhu et al. 2015: g = 1/256, alpha and rate timers of 55 us, a 10 MB byte
    # counter, F = 5 fast-recovery steps, R_AI = 40 Mbps, CNPs at most every
    # 50 us, all for a 40 Gbps NIC. R_HAI is ten times R_AI, the ratio of QCN's
    # defaults (IEEE 802.1Qau: 5 and 50 Mbps). The paper has no limit on how
    # often a sender cuts: every CNP is one cut.
    "reference_rate_bps": 40e9,
    "g": 1 / 256,
    "alpha_init": 1.0,
    "alpha_period": 55e-6,
    "rate_increase_period": 55e-6,
    "byte_counter": 10_000_000,
    "fast_recovery_steps": 5,
    "rate_ai_bps": 40e6,
    "rate_hai_bps": 400e6,
    "min_rate_bps": 10e6,
    "rate_reduce_period": 0.0,
    "cnp_interval_s": 50e-6,
}

_NIC: Final[dict[str, Any]] = {
    # astra-network-ns3 scratch/config/config.txt, set on ns3::RdmaHw by
    # scratch/common.h: EWMA_GAIN 0.00390625, ALPHA_RESUME_INTERVAL 1 (us),
    # RATE_DECREASE_INTERVAL 4 (us), RP_TIMER 900 (us), FAST_RECOVERY_TIMES 1,
    # RATE_AI 50Mb/s, RATE_HAI 100Mb/s, MIN_RATE 100Mb/s, CLAMP_TARGET_RATE 0.
    # rdma-hw.cc sets alpha to 1 on a flow's first CNP and has no byte counter.
    # The rates are absolute on the note's 400 Gbps host links.
    "reference_rate_bps": 400e9,
    "g": 0.00390625,
    "alpha_init": 1.0,
    "alpha_period": 1e-6,
    "rate_increase_period": 900e-6,
    "byte_counter": 0,
    "fast_recovery_steps": 1,
    "rate_ai_bps": 50e6,
    "rate_hai_bps": 100e6,
    "min_rate_bps": 100e6,
    "rate_reduce_period": 4e-6,
    # NVIDIA's DCQCN parameters (notification point, MIN_TIME_BETWEEN_CNPS =
    # min_time_between_cnps): 4 us on ConnectX adapters; marks inside it send
    # no CNP. docs/dcqcn.md says why this and not ns-3's ECN echo on every ACK.
    "cnp_interval_s": 4e-6,
}

_OFF: Final[dict[str, Any]] = {
    # Congestion control off (the note's "packet trimming on and congestion control off"):
    # the reaction point never cuts. The notification point is the nic profile's, so marks
    # still bring CNPs and both are counted as under DCQCN.
    **_NIC,
}

PROFILE_VALUES: Final[dict[str, dict[str, Any]]] = {"paper": _PAPER, "nic": _NIC, "off": _OFF}
"""Each profile's constants, by DcqcnParams field name."""

_EPS: Final = 1e-9
"""Tolerance, in periods, for "at the same instant" on the timers' grids."""


@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class DcqcnParams:
    """One profile's constants, scaled to a link. Fields left None take the profile's value.

    `rate_reduce_period` is 0 for the paper (every notification cuts at once)
    and the NIC's cut-check period otherwise; `byte_counter` 0 means none.
    An ordinary Python class where the module is compiled (common/native.py): it fills its
    `None` fields after construction, which a compiled class's typed fields cannot hold. The
    reaction points below, the hot part, compile; they read it at a flow's start and at their
    timer events, as ordinary attribute lookups.
    """

    line_rate_bps: float
    time_scale: float = 1.0
    profile: str = DEFAULT_PROFILE
    reference_rate_bps: float = None  # type: ignore[assignment]
    g: float = None  # type: ignore[assignment]
    alpha_init: float = None  # type: ignore[assignment]
    alpha_period: float = None  # type: ignore[assignment]
    rate_increase_period: float = None  # type: ignore[assignment]
    byte_counter: int = None  # type: ignore[assignment]
    fast_recovery_steps: int = None  # type: ignore[assignment]
    rate_ai_bps: float = None  # type: ignore[assignment]
    rate_hai_bps: float = None  # type: ignore[assignment]
    min_rate_bps: float = None  # type: ignore[assignment]
    rate_reduce_period: float = None  # type: ignore[assignment]
    cnp_interval_s: float = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.profile not in PROFILE_VALUES:
            raise ValueError(
                f"unknown DCQCN profile {self.profile!r}; known: {', '.join(PROFILES)}"
            )
        for f in fields(self):
            if getattr(self, f.name) is None:
                object.__setattr__(self, f.name, PROFILE_VALUES[self.profile][f.name])
        if self.line_rate_bps <= 0:
            raise ValueError(f"line_rate_bps must be > 0, got {self.line_rate_bps}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if not 0 < self.g < 1:
            raise ValueError(f"g must lie in (0, 1), got {self.g}")
        if self.min_rate_bps > self.reference_rate_bps:
            raise ValueError("min_rate_bps exceeds reference_rate_bps")
        for name in ("alpha_period", "rate_increase_period"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.profile != "paper" and self.rate_reduce_period <= 0:
            raise ValueError("the nic profile checks for cuts periodically: rate_reduce_period > 0")
        if self.fast_recovery_steps < 0 or self.byte_counter < 0 or self.cnp_interval_s < 0:
            raise ValueError("fast_recovery_steps, byte_counter and cnp_interval_s must be >= 0")

    @classmethod
    def for_profile(
        cls, profile: str, line_rate_bps: float, time_scale: float = 1.0
    ) -> DcqcnParams:
        """What a command line's `--dcqcn PROFILE` builds for a host's link and clock."""
        return cls(line_rate_bps=line_rate_bps, time_scale=time_scale, profile=profile)

    # Scaled views: what the reaction and notification points actually use.
    def period(self, seconds: float) -> float:
        return seconds * self.time_scale

    def rate(self, bps: float) -> float:
        return bps * self.line_rate_bps / self.reference_rate_bps

    def byte_count(self, nbytes: float) -> int:
        return max(
            1, round(nbytes * self.line_rate_bps / self.reference_rate_bps * self.time_scale)
        )

    @property
    def cnp_interval(self) -> float:
        """The notification point's CNP interval on the emulation's clock."""
        return self.period(self.cnp_interval_s)

    @property
    def cnp_at_window_end(self) -> bool:
        """Whether a mark inside the CNP interval is answered when the interval ends (the
        paper's notification point) or not at all (a NIC's minimum time between CNPs)."""
        return self.profile == "paper"

    def receiver_fields(self) -> dict[str, Any]:
        """The notification point's half of the profile, as ReceiverPolicy fields."""
        return {"cnp_interval": self.cnp_interval, "cnp_at_window_end": self.cnp_at_window_end}


def new_rate(params: DcqcnParams, now: float) -> DcqcnRate | NicDcqcnRate | LineRate:
    """A flow's reaction point for the params' profile."""
    if params.profile == "nic":
        return NicDcqcnRate(params, now)
    if params.profile == OFF:
        return LineRate(params)
    return DcqcnRate(params, now)


BELOW_LINE: Final = 0.999
"""A rate under this share of the line rate counts as below it: a recovery halfway to the
target stays a hair under it for long, as ns-3's counters patch measures its QPs
(docs/astra-sim.md)."""


class _ReactionPoint:
    """What both profiles share: the scaled constants, the rate pair and the counters.

    Timers are applied lazily: every call first replays the timer expiries that
    fell before `now`, in order.
    """

    __slots__ = (
        "_ai",
        "_alpha_period",
        "_below_since",
        "_hai",
        "_inc_period",
        "_line",
        "_min",
        "alpha",
        "below_s",
        "current",
        "cuts",
        "mark_cuts",
        "params",
        "target",
        "timer_stage",
    )

    def __init__(self, params: DcqcnParams) -> None:
        self.params = params
        # a float even where the configuration gave an int, as the compiled sender's float
        # fields hold it, so both paths write the same records
        self._line = float(params.line_rate_bps)
        self._min = params.rate(params.min_rate_bps)
        self._ai = params.rate(params.rate_ai_bps)
        self._hai = params.rate(params.rate_hai_bps)
        self._alpha_period = params.period(params.alpha_period)
        self._inc_period = params.period(params.rate_increase_period)
        self.current = self._line
        self.target = self._line
        self.alpha = params.alpha_init
        self.timer_stage = 0
        self.cuts = 0
        self.mark_cuts = 0
        """Cuts that answered an ECN mark (a CNP, or the echo on a report), not a trim alone."""
        self.below_s = 0.0
        """Time spent below the line rate (BELOW_LINE of it) until the last change of rate."""
        self._below_since = -1.0
        """When the rate last fell below the line rate, while it is; -1 at the line rate."""

    def _cut(self, mark: bool, at: float) -> None:
        self.current = max(self.current * (1 - self.alpha / 2), self._min)
        self.cuts += 1
        self.mark_cuts += mark
        self._track(at)

    def _track(self, at: float) -> None:
        """Note a change of rate at `at`: the time below the line rate starts or ends."""
        if self.current < self._line * BELOW_LINE:
            if self._below_since < 0:
                self._below_since = at
        elif self._below_since >= 0:
            self.below_s += at - self._below_since
            self._below_since = -1.0

    def below_line_s(self, at: float) -> float:
        """Time spent below the line rate up to `at` (which comes after every change so far)."""
        since = self._below_since
        return self.below_s + (at - since if 0 <= since < at else 0.0)

    @property
    def cuts_due(self) -> int:
        """Cuts taken, and any already due at a check still ahead: nothing cancels it, so a
        flow that ends before that check has still taken it."""
        return self.cuts

    @property
    def mark_cuts_due(self) -> int:
        """Of `cuts_due`, those that answered a mark."""
        return self.mark_cuts

    def _at_line(self) -> bool:
        return self.current >= self._line and self.target >= self._line

    def _towards_target(self, step: float, at: float) -> None:
        """Raise the target by `step` (capped at the line rate), then move halfway to it."""
        self.target = min(self.target + step, self._line)
        self.current = (self.target + self.current) / 2
        self._track(at)


class DcqcnRate(_ReactionPoint):
    """The paper's reaction point for one flow.

    A CNP remembers the current rate as the target, cuts by alpha/2, then
    raises alpha and restarts the increase timer and byte counter. Each timer expiry
    or `byte_counter` bytes sent is an increase event; with T and BC the timer
    and byte events already counted since the cut, an event recovers halfway to
    the target while max(T, BC) < F (F events of fast recovery), raises the
    target by R_HAI * (min(T, BC) - F) once both exceed F, and by R_AI otherwise.
    With no CNP for an alpha period, alpha decays by (1 - g).
    """

    __slots__ = ("_alpha_t", "_byte_counter", "_bytes_since", "_due", "_inc_t", "byte_stage")

    def __init__(self, params: DcqcnParams, now: float) -> None:
        super().__init__(params)
        self._byte_counter = params.byte_count(params.byte_counter) if params.byte_counter else 0
        self.byte_stage = 0
        self._bytes_since = 0
        self._alpha_t = now
        self._inc_t = now
        self._set_due()

    def _set_due(self) -> None:
        """The earliest time a timer may have expired, so that most calls return at once."""
        self._due = min(
            self._alpha_t + self._alpha_period * (1 - _EPS),
            self._inc_t + self._inc_period * (1 - _EPS),
        )

    def _replay_timers(self, now: float) -> None:
        # A timer that expires at `now` itself has fired: a CNP at that instant
        # comes after it.
        if now < self._due:
            return
        n = math.floor((now - self._alpha_t) / self._alpha_period + _EPS)
        if n > 0:
            self.alpha *= (1 - self.params.g) ** n
            self._alpha_t += n * self._alpha_period
        n = math.floor((now - self._inc_t) / self._inc_period + _EPS)
        if n > 0:
            first = self._inc_t
            self._inc_t += n * self._inc_period
            for k in range(n):
                if self._at_line():
                    self.timer_stage += n - k  # at line rate already: only the stage moves
                    break
                self._increase(first + (k + 1) * self._inc_period)
                self.timer_stage += 1
        self._set_due()

    def _increase(self, at: float) -> None:
        f = self.params.fast_recovery_steps
        if max(self.timer_stage, self.byte_stage) < f:
            self._towards_target(0.0, at)  # fast recovery
        elif min(self.timer_stage, self.byte_stage) > f:
            self._towards_target(self._hai * (min(self.timer_stage, self.byte_stage) - f), at)
        else:
            self._towards_target(self._ai, at)

    def rate_at(self, now: float) -> float:
        self._replay_timers(now)
        return self.current

    def next_change(self, now: float) -> float:
        """The earliest time after `now` at which `rate_at` may return another rate with no
        notification in between: the next increase event, unless at the line rate already.
        (Byte-counter events come from sending, which the sender sees itself.)"""
        self._replay_timers(now)
        return math.inf if self._at_line() else self._inc_t + self._inc_period

    def on_sent(self, nbytes: int, now: float) -> None:
        """The byte counter: every `byte_counter` bytes sent is one rate-increase event."""
        self._replay_timers(now)
        if not self._byte_counter:
            return
        self._bytes_since += nbytes
        while self._bytes_since >= self._byte_counter:
            self._bytes_since -= self._byte_counter
            self._increase(now)
            self.byte_stage += 1

    def reduce(self, now: float, mark: bool = True) -> bool:
        """A congestion notification (`mark`: an ECN mark's, else a trim's): cut now.
        Returns True: every notification is a cut."""
        self._replay_timers(now)
        self.target = self.current
        self._cut(mark, now)
        g = self.params.g
        self.alpha = (1 - g) * self.alpha + g
        self._alpha_t = now
        self._inc_t = now
        self._set_due()
        self._bytes_since = 0
        self.timer_stage = 0
        self.byte_stage = 0
        return True


class NicDcqcnRate(_ReactionPoint):
    """The NIC profile's reaction point for one flow (the `...Mlx` model of rdma-hw.cc).

    Nothing runs before the flow's first notification. That one sets alpha to
    `alpha_init` and starts two grids from its own time: an alpha update every
    `alpha_period` (alpha = (1-g)*alpha + g if a notification arrived since the
    previous update, (1-g)*alpha otherwise) and a cut check every
    `rate_reduce_period`. A check that finds a notification since the last cut
    cuts by alpha/2 (using the alpha of the update at the same instant),
    lowers the target to the current rate only if an increase event has happened
    since the previous cut, and restarts the increase timer. Each expiry of that
    timer, with n the events since the cut: n < F recovers halfway to the
    target, n == F adds R_AI to the target, n > F adds R_HAI, each then moving
    halfway to it. A notification at the very instant of an alpha update counts
    towards the next update; one at the instant of a check or timer expiry is
    seen by it.
    """

    __slots__ = (
        "_alpha_flag",
        "_check_at",
        "_check_period",
        "_cut_pending",
        "_inc_at",
        "_mark_pending",
        "_origin",
        "_ticks",
    )

    def __init__(self, params: DcqcnParams, now: float) -> None:
        super().__init__(params)
        self._check_period = params.period(params.rate_reduce_period)
        self._origin: float | None = None
        self._ticks = 0
        self._alpha_flag = False
        self._cut_pending = False
        self._mark_pending = False
        self._check_at = math.inf
        self._inc_at = math.inf

    def _sync_alpha(self, t: float) -> None:
        """Apply the alpha updates at or before `t`."""
        k = math.floor((t - self._origin) / self._alpha_period + _EPS)  # type: ignore[operator]
        n = k - self._ticks
        if n <= 0:
            return
        g = self.params.g
        if self._alpha_flag:
            self.alpha = (1 - g) * self.alpha + g
            self._alpha_flag = False
            n -= 1
        self.alpha *= (1 - g) ** n
        self._ticks = k

    def _replay(self, now: float) -> None:
        """Apply, in time order, the timer expiries and cut checks before `now`.

        At one instant the increase timer goes before the cut check: in rdma-hw.cc
        both fall on the same grid (RP_TIMER is a multiple of the check period) and
        the timer was scheduled first. Events at `now` itself wait, so a
        notification arriving at that instant is seen by them.
        """
        inc_slack = _EPS * self._inc_period
        check_slack = _EPS * self._check_period
        while True:
            inc = self._inc_at
            check = self._check_at if self._cut_pending else math.inf
            if inc < now - inc_slack and inc <= check + check_slack:
                if check == math.inf and self._at_line():
                    n = math.ceil((now - inc) / self._inc_period - _EPS)
                    self.timer_stage += n  # at line rate already: only the stage moves
                    self._inc_at = inc + n * self._inc_period
                    continue
                f = self.params.fast_recovery_steps
                stage = self.timer_stage
                self._towards_target(
                    0.0 if stage < f else self._ai if stage == f else self._hai, inc
                )
                self.timer_stage = stage + 1
                self._inc_at = inc + self._inc_period
            elif check < now - check_slack:
                self._sync_alpha(check)
                if self.timer_stage:  # CLAMP_TARGET_RATE 0: keep the target across cuts
                    self.target = self.current
                self._cut(self._mark_pending, check)
                self.timer_stage = 0
                self._cut_pending = self._mark_pending = False
                self._inc_at = check + self._inc_period
            else:
                break
        if self._origin is not None:
            self._sync_alpha(now)

    def rate_at(self, now: float) -> float:
        if now >= self._inc_at or self._cut_pending:
            self._replay(now)
        return self.current

    @property
    def cuts_due(self) -> int:
        return self.cuts + self._cut_pending

    @property
    def mark_cuts_due(self) -> int:
        return self.mark_cuts + (self._cut_pending and self._mark_pending)

    def next_change(self, now: float) -> float:
        """The earliest time after `now` at which `rate_at` may return another rate with no
        notification in between: just after the pending cut check or the next increase
        event (events at a query's own instant wait for it, `_replay`), whichever is first."""
        self.rate_at(now)
        inc = self._inc_at + 2 * _EPS * self._inc_period
        if self._cut_pending:
            return min(inc, self._check_at + 2 * _EPS * self._check_period)
        return math.inf if self._at_line() else inc

    def on_sent(self, nbytes: int, now: float) -> None:
        """No byte counter in this profile: increase events come from the timer alone."""

    def reduce(self, now: float, mark: bool = True) -> bool:
        """A congestion notification (`mark`: an ECN mark's, else a trim's): flagged for the
        next alpha update and cut check, whose cut answers a mark if any of its notifications
        was one. Returns False: the cut, if any, happens at that check."""
        self._replay(now)
        self._mark_pending = self._mark_pending or mark
        if self._origin is None:
            self._origin = now
            self.alpha = self.params.alpha_init
            self.target = self.current
        else:
            self._alpha_flag = True
        if not self._cut_pending:
            self._cut_pending = True
            j = max(1, math.ceil((now - self._origin) / self._check_period - _EPS))
            self._check_at = max(self._origin + j * self._check_period, now)
        return False


class LineRate(_ReactionPoint):
    """Congestion control off: every flow sends at the line rate, and no notification cuts."""

    __slots__ = ()

    def rate_at(self, now: float) -> float:
        return self.current

    def next_change(self, now: float) -> float:
        return math.inf

    def on_sent(self, nbytes: int, now: float) -> None:
        """Nothing to count: the rate never changes."""

    def reduce(self, now: float, mark: bool = True) -> bool:
        """A congestion notification, counted by the sender and otherwise ignored."""
        return False
