"""What a run measured, in the note's terms: one record per run and a side-by-side table.

The runner fills `RunResult` from the agents' JSON lines and the switches'
counters; everything here works on those records alone, so a table (or, in
`runs.plots`, a plot) can be rebuilt from a results folder without
rerunning anything. `runs.report` writes and reads that folder.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from runs.typed import from_doc

BASELINE = "tight"


@dataclass
class StepResult:
    step: int
    critical: bool
    duration_s: float
    allreduce_s: list[float]
    """Per receiving rank: from the step's first gradient send to its all-reduce completing."""
    expected_bytes: int
    forgiven_bytes: int
    budget_bytes: int
    bound_held: bool
    misclassified: bool = False
    """The detector's verdict on this step was wrong on purpose (`critical` is the verdict)."""
    trim_fifths: list[list[int]] | None = None
    """Per fifth of the step, summed over the receiving ranks: bytes trimmed, of those from
    gradient flows, and of those forgiven at once (host_agent.endpoint.TRIM_FIELDS)."""
    allreduce_trim_fifths: list[list[int]] | None = None
    """The same per fifth of the step's all-reduce, the span its loss budget is open (trims
    before it count in the first fifth)."""
    ended_s: float | None = None
    """When the last rank finished the step, on the run's clock (shared by its hosts)."""


@dataclass
class RunResult:
    policy: str
    seed: int
    fabric: str
    time_scale: float
    training_time_s: float
    steps: list[StepResult]
    data_bytes_sent: int
    retransmitted_bytes: int
    data_packets_sent: int
    trims: int
    ce_marks: int
    cnps: int
    rtos: int
    exemption_toggles: list[int]
    """Mode changes of each exemption-eligible flow."""
    tp_completion_s: list[float]
    bound_violations: int
    switch_counters: dict[str, dict[str, int]] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    """Samples over the run: time and cumulative trims and CE marks over all switches."""
    accounting: dict[str, int] = field(default_factory=dict)
    """Totals that must add up across hosts and switches (see runs.collect)."""
    loss: dict[str, Any] | None = None
    """The run's loss record (workload.lossrecord, schema in docs/impact.md); None in older results."""
    trim_drops: int = 0
    """Packets the switches trimmed but dropped because the trim queue was full (SAI's
    DROPPED_TRIM_PACKETS); `trims` counts them too."""
    trims_located: dict[str, int] = field(default_factory=dict)
    """Trimmed headers the receivers saw, by where their DSCP says they were trimmed ("host":
    on a host downlink, the last hop; "fabric"; "unlocated"); empty without asymmetric DSCP."""
    exemption: dict[str, float] = field(default_factory=dict)
    """Over the flows sent: `exempt_flows` (exempt at least once), `obeyed_again_flows` (of
    those, obeying congestion control again later), `obeying_again_episodes` and
    `obeying_again_s` (their number and total time, on the run's clock)."""
    trimmed_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes that reached receivers as trimmed headers, from `eligible` (exemption-eligible)
    flows and from `other` flows."""
    late_acks: int = 0
    """Resent segments acknowledged sooner than any round trip could bring the resend's
    ACK: the earlier copy was late, not lost (summed over the flows sent)."""
    rtt_max_s: float = 0.0
    """The longest round trip any sender sampled, on the run's clock."""
    rate_cuts: int = 0
    """Rate cuts the senders' reaction points took (summed over the flows sent)."""
    mark_cuts: int = 0
    """Of those, the cuts that answered an ECN mark rather than a trim alone."""
    switch_restarts: list[dict[str, Any]] = field(default_factory=list)
    """Each switch the run started again (RunConfig.switch_restarts): its name, how its
    process ended, when the run noticed, and `lost_s`, the interval until the controller had
    configured it again (the outage, less up to one sampling interval before it was seen)."""
    companion: dict[str, Any] | None = None
    """A second training job that shared the fabric (RunConfig.companion): its own RunResult
    as JSON, collected from its hosts' records; the switch counters are the fabric's."""

    @property
    def gradient_bytes(self) -> int:
        return sum(s.expected_bytes for s in self.steps)

    @property
    def forgiven_bytes(self) -> int:
        return sum(s.forgiven_bytes for s in self.steps)

    def metrics(self) -> dict[str, float | int | bool | None]:
        crit = [t for s in self.steps if s.critical for t in s.allreduce_s]
        norm = [t for s in self.steps if not s.critical for t in s.allreduce_s]
        return {
            "training_time_s": self.training_time_s,
            "fabric_training_time_ms": 1e3 * self.training_time_s / self.time_scale,
            "allreduce_critical_ms": _median_ms(crit),
            "allreduce_noncritical_ms": _median_ms(norm),
            "forgiven_pct": _pct(self.forgiven_bytes, self.gradient_bytes),
            "retransmitted_pct": _pct(self.retransmitted_bytes, self.data_bytes_sent),
            "trim_rate_pct": _pct(self.trims, self.data_packets_sent),
            "trims_last_hop": self.trims_located.get("host") if self.trims_located else None,
            "trims_fabric": self.trims_located.get("fabric") if self.trims_located else None,
            "trim_drops": self.trim_drops,
            "ce_marks": self.ce_marks,
            "cnps": self.cnps,
            "rate_cuts": self.rate_cuts,
            "mark_cut_pct": _pct(self.mark_cuts, self.rate_cuts) if self.rate_cuts else None,
            "rtos": self.rtos,
            "late_acks": self.late_acks,
            "rtt_max_ms": 1e3 * self.rtt_max_s,
            "toggles_per_exempt_flow": (
                statistics.fmean(self.exemption_toggles) if self.exemption_toggles else 0.0
            ),
            "bound_held": self.bound_violations == 0 and all(s.bound_held for s in self.steps),
            "tp_completion_ms": _median_ms(self.tp_completion_s),
        }

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "metrics": self.metrics()}

    @classmethod
    def from_json(cls, doc: Any, where: str = "run") -> RunResult:
        """The record `to_json` wrote, every field checked (runs.typed.RecordError)."""
        return from_doc(cls, doc, where, ignore=frozenset({"metrics"}))


def _median_ms(values: Sequence[float]) -> float | None:
    return 1e3 * statistics.median(values) if values else None


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


# -- comparison -------------------------------------------------------------------


def _duration(decimals: int) -> str:
    """A format marker: at least `decimals` decimals and three significant digits, so that a
    simulated run's milliseconds read as clearly as an emulated run's seconds."""
    return f"duration:{decimals}"


def _format(fmt: str, value: Any) -> str:
    if fmt.startswith("duration:"):
        decimals = int(fmt.partition(":")[2])
        if value:
            decimals = max(decimals, 2 - math.floor(math.log10(abs(value))))
        return f"{value:.{decimals}f}"
    return fmt.format(value)


COLUMNS = [
    ("training_time_s", "train s", _duration(2)),
    ("time_vs_tight_pct", "vs tight %", "{:+.1f}"),
    ("allreduce_critical_ms", "AR crit ms", _duration(0)),
    ("allreduce_noncritical_ms", "AR non-crit ms", _duration(0)),
    ("forgiven_pct", "forgiven %", "{:.2f}"),
    ("retransmitted_pct", "retx %", "{:.2f}"),
    ("trim_rate_pct", "trim %", "{:.2f}"),
    ("trims_last_hop", "last-hop trims", "{:.0f}"),
    ("trims_fabric", "fabric trims", "{:.0f}"),
    ("trim_drops", "trim drops", "{:.0f}"),
    ("ce_marks", "CE marks", "{:.0f}"),
    ("cnps", "CNPs", "{:.0f}"),
    ("rtos", "RTOs", "{:.0f}"),
    ("toggles_per_exempt_flow", "toggles/flow", "{:.2f}"),
    ("tp_completion_ms", "TP ms", _duration(0)),
    ("bound_held", "bound held", "{}"),
]


def compare(runs: Iterable[RunResult]) -> dict[str, dict[str, Any]]:
    """Per policy, each metric as the list of its per-seed values; the change in training
    time is taken against the baseline run with the same seed, as the note does."""
    runs = list(runs)
    baseline = {r.seed: r.training_time_s for r in runs if r.policy == BASELINE}
    table: dict[str, dict[str, Any]] = defaultdict(lambda: defaultdict(list))
    for run in sorted(runs, key=lambda r: (r.policy, r.seed)):
        row = table[run.policy]
        for key, value in run.metrics().items():
            row[key].append(value)
        base = baseline.get(run.seed)
        row["time_vs_tight_pct"].append(
            None if base is None else 100.0 * (run.training_time_s - base) / base
        )
        row["seeds"].append(run.seed)
    return {policy: dict(row) for policy, row in table.items()}


def range_cell(values: list[Any], fmt: str) -> str:
    """One table cell for per-seed values: lo..hi, a single value, yes/no (n) for flags, or -."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    if isinstance(present[0], bool):
        return "yes" if all(present) else f"no ({present.count(False)})"
    lo, hi = min(present), max(present)
    if len(present) == 1 or _format(fmt, lo) == _format(fmt, hi):
        return _format(fmt, lo)
    return f"{_format(fmt, lo)}..{_format(fmt, hi)}"


def render_table(rows: Sequence[Sequence[str]]) -> str:
    """Plain-text columns: the first row is the header, the first column left-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def all_critical(runs: Sequence[RunResult]) -> str | None:
    """A line under a table whose runs had every step critical, or None: no loss budget was
    open, so forgive's rows are tight's run for run, and the table says why."""
    if not runs or not all(s.critical for r in runs for s in r.steps):
        return None
    steps = sorted({len(r.steps) for r in runs})
    return (
        f"every step of every run was critical ({'/'.join(map(str, steps))} steps; the note's "
        "schedule marks steps 1, 2, 3 and the last): no loss budget was open, so forgive ran "
        "as tight, digit for digit; run 5 or more steps, or name the critical ones with "
        "--critical-steps"
    )


def format_table(summary: dict[str, dict[str, Any]], order: Sequence[str] | None = None) -> str:
    """A plain-text table, one row per policy; a range lo..hi spans the seeds."""
    policies = [p for p in (order or sorted(summary)) if p in summary]
    header = ["policy", "seeds"] + [title for _, title, _ in COLUMNS]
    rows = [header]
    for policy in policies:
        row = summary[policy]
        rows.append(
            [policy, str(len(row["seeds"]))]
            + [range_cell(row.get(key, []), fmt) for key, _, fmt in COLUMNS]
        )
    return render_table(rows)
