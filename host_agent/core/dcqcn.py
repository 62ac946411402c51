"""DCQCN's reaction point: the per-flow sending rate that CNPs and retransmission requests cut.

Defaults follow the DCQCN paper's configuration (Zhu et al., "Congestion Control
for Large-Scale RDMA Deployments", SIGCOMM 2015: g = 1/256, alpha and rate
timers of 55 us, a 10 MB byte counter, F = 5 fast-recovery steps, 40 Mbps
additive increase, CNPs at most every 50 us per flow). The hyper-increase step
is ten times the additive one, the ratio of QCN's defaults (IEEE 802.1Qau:
5 and 50 Mbps). All of them describe a 40 Gbps NIC (`reference_rate_bps`).

Two scalings keep the dynamics when the link is not that NIC. Rate-valued
constants (additive and hyper increase, minimum rate) are fractions of the
reference rate and are applied as the same fractions of `line_rate_bps`.
`time_scale` says how many times slower the emulation's clock runs than the
fabric it stands for: every period is multiplied by it, and the byte counter
is the bytes the link would send in its period-equivalent, so it scales with
both the rate ratio and `time_scale`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DcqcnParams:
    line_rate_bps: float
    time_scale: float = 1.0
    reference_rate_bps: float = 40e9
    g: float = 1 / 256
    alpha_init: float = 1.0
    alpha_period: float = 55e-6
    rate_increase_period: float = 55e-6
    byte_counter: int = 10_000_000
    fast_recovery_steps: int = 5
    rate_ai_bps: float = 40e6
    rate_hai_bps: float = 400e6
    min_rate_bps: float = 10e6
    rate_reduce_period: float = 50e-6
    cnp_interval_s: float = 50e-6

    def __post_init__(self) -> None:
        if self.line_rate_bps <= 0:
            raise ValueError(f"line_rate_bps must be > 0, got {self.line_rate_bps}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if not 0 < self.g < 1:
            raise ValueError(f"g must lie in (0, 1), got {self.g}")
        if self.min_rate_bps > self.reference_rate_bps:
            raise ValueError("min_rate_bps exceeds reference_rate_bps")

    # Scaled views: what the reaction point actually uses.
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


class DcqcnRate:
    """One flow's DCQCN rate state. Timers are applied lazily: every call first replays the
    alpha and rate-increase timer expiries that fell before `now`, in order."""

    __slots__ = (
        "_ai",
        "_alpha_period",
        "_alpha_t",
        "_byte_counter",
        "_bytes_since",
        "_hai",
        "_inc_period",
        "_inc_t",
        "_last_cut",
        "_line",
        "_min",
        "_reduce_period",
        "alpha",
        "byte_stage",
        "current",
        "cuts",
        "params",
        "target",
        "timer_stage",
    )

    def __init__(self, params: DcqcnParams, now: float) -> None:
        self.params = params
        self._line = params.line_rate_bps
        self._min = params.rate(params.min_rate_bps)
        self._ai = params.rate(params.rate_ai_bps)
        self._hai = params.rate(params.rate_hai_bps)
        self._alpha_period = params.period(params.alpha_period)
        self._inc_period = params.period(params.rate_increase_period)
        self._reduce_period = params.period(params.rate_reduce_period)
        self._byte_counter = params.byte_count(params.byte_counter)
        self.current = self._line
        self.target = self._line
        self.alpha = params.alpha_init
        self.timer_stage = 0
        self.byte_stage = 0
        self.cuts = 0
        self._bytes_since = 0
        self._alpha_t = now
        self._inc_t = now
        self._last_cut: float | None = None

    def _replay_timers(self, now: float) -> None:
        n = int((now - self._alpha_t) / self._alpha_period)
        if n > 0:
            self.alpha *= (1 - self.params.g) ** n
            self._alpha_t += n * self._alpha_period
        n = int((now - self._inc_t) / self._inc_period)
        if n > 0:
            self._inc_t += n * self._inc_period
            for k in range(n):
                if self.current >= self._line and self.target >= self._line:
                    self.timer_stage += n - k  # at line rate already: only the stage moves
                    break
                self.timer_stage += 1
                self._increase()

    def _increase(self) -> None:
        f = self.params.fast_recovery_steps
        if max(self.timer_stage, self.byte_stage) < f:
            pass  # fast recovery: move halfway back towards the target
        elif min(self.timer_stage, self.byte_stage) > f:
            self.target += self._hai * (min(self.timer_stage, self.byte_stage) - f)
        else:
            self.target += self._ai
        self.target = min(self.target, self._line)
        self.current = min((self.target + self.current) / 2, self._line)

    def rate_at(self, now: float) -> float:
        self._replay_timers(now)
        return self.current

    def on_sent(self, nbytes: int, now: float) -> None:
        """The byte counter: every `byte_counter` bytes sent is one rate-increase event."""
        self._replay_timers(now)
        self._bytes_since += nbytes
        while self._bytes_since >= self._byte_counter:
            self._bytes_since -= self._byte_counter
            self.byte_stage += 1
            self._increase()

    def reduce(self, now: float) -> bool:
        """ReduceRate: remember the rate as target, cut by alpha/2, raise alpha, restart the
        increase timer and byte counter. At most one cut per `rate_reduce_period`."""
        self._replay_timers(now)
        if self._last_cut is not None and now - self._last_cut < self._reduce_period:
            return False
        self._last_cut = now
        self.target = self.current
        self.current = max(self.current * (1 - self.alpha / 2), self._min)
        g = self.params.g
        self.alpha = (1 - g) * self.alpha + g
        self._alpha_t = now
        self._inc_t = now
        self._bytes_since = 0
        self.timer_stage = 0
        self.byte_stage = 0
        self.cuts += 1
        return True
