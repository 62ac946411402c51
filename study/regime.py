"""`forgive study regime`: where FORGIVE pays, mapped against what sets the baseline's slack.

The note's saving is not a property of the protocol alone: it comes out of the gap between its
DCQCN baseline's all-reduce and the all-reduce's line-rate bound (`study.slack`). Each cell of the
grid changes one thing that sets that gap from a base point (the note's 64-rank 4:1 fabric and
job at the study's byte scale): the ring step against the port buffer, the DCQCN profile, the
fabric's oversubscription, and the other regime options the fabric and job offer. Every cell runs
`tight` and `forgive` on the same seeds, and the grid reports per cell the baseline's slack,
forgive's change in training time, the gradient bytes it gave up, the trim rate under both, and
forgive's CNPs and RTOs against tight's: one point per cell of saving against slack.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from host_agent.core import DEFAULT_PROFILE, PROFILES
from runplan.fabric import (
    DCQCN_STATES,
    PRESETS,
    WINDOWS,
    FabricError,
    FabricSpec,
    NicSettings,
    SwitchSettings,
    with_data_queue,
)
from runplan.run import RunConfig, RunError, Workload
from runs.options import REGIME_PROFILES, profile_job, with_settings
from runs.options import with_profile as profile_fabric
from runs.results import RunResult, render_table
from study.claims import number
from study.slack import allreduce_bound_s, busiest_uplink_hops
from workload.plan import TP_PHASES

TIGHT, FORGIVE = "tight", "forgive"
POLICIES = (TIGHT, FORGIVE)
NOTE_SLACK = 32.3 / 10.57
"""The note's tight all-reduce (32.3 ms, Results ¶2) over its 4:1 fabric's line-rate bound."""
NOTE_SAVING = (16.1, 16.7)
"""forgive's saving against tight in the note, percent (Results ¶2)."""


def ring_step_bytes(config: RunConfig) -> float:
    """What one ring step puts on the busiest leaf uplink: one chunk (the gradient over the
    ranks) from each rank whose successor sits behind that uplink, ECMP sharing the spines."""
    n, hops = busiest_uplink_hops(config)
    chunk = config.workload.grad_bytes / n
    if not hops or not config.fabric.spines:
        return chunk
    return chunk * hops / config.fabric.spines


def with_step_over_buffer(config: RunConfig, ratio: float) -> RunConfig:
    """The data queue resized so that a ring step is `ratio` times it, marking at the note's
    fractions of it (`runplan.fabric.with_data_queue`)."""
    queue = int(ring_step_bytes(config) / ratio)
    return replace(config, fabric=with_data_queue(config.fabric, queue))


def with_nic(config: RunConfig, **settings: Any) -> RunConfig:
    """The hosts' transport changed (runplan.fabric.NicSettings)."""
    nic = replace(config.fabric.nic, **settings)
    return replace(config, fabric=replace(config.fabric, nic=nic))


def with_fabric(config: RunConfig, name: str) -> RunConfig:
    """Another preset at the same scaling."""
    spec: FabricSpec = PRESETS[name]
    return replace(config, fabric=replace(spec, scaling=config.fabric.scaling))


def with_profile(config: RunConfig, name: str) -> RunConfig:
    """A named set of regime options (runs.options.REGIME_PROFILES), as `--profile
    name` sets them: its DCQCN profile, the fabric through runs.options.with_profile, and
    the job's part (runs.options.profile_job)."""
    dcqcn = str(REGIME_PROFILES[name]["dcqcn"])
    workload = replace(config.workload, **profile_job(name))
    return replace(
        config, dcqcn=dcqcn, fabric=profile_fabric(config.fabric, name), workload=workload
    )


def _default(cls: type, name: str) -> Any:
    """The project's own value of a setting: its dataclass field's default."""
    return next(f.default for f in fields(cls) if f.name == name)


def _job_default(config: RunConfig, *names: str) -> RunConfig:
    workload = replace(config.workload, **{n: _default(Workload, n) for n in names})
    return replace(config, workload=workload)


def _fabric_default(config: RunConfig, key: str, cls: type = NicSettings) -> RunConfig:
    return replace(config, fabric=with_settings(config.fabric, {key: _default(cls, key)}))


MECHANISMS: dict[str, Callable[[RunConfig], RunConfig]] = {
    "splits": lambda c: _job_default(c, "splits", "active_splits"),
    "completion": lambda c: _job_default(c, "completion"),
    "local-mem": lambda c: _job_default(c, "reduce_bytes_per_s"),
    "control": lambda c: _fabric_default(c, "control", SwitchSettings),
    "ack-every": lambda c: _fabric_default(c, "ack_every"),
    "paths": lambda c: _fabric_default(c, "paths"),
    "cnp": lambda c: _fabric_default(c, "cnp"),
    "payload": lambda c: _fabric_default(c, "payload_bytes"),
    "window": lambda c: _fabric_default(c, "window"),
    "dcqcn": lambda c: replace(c, dcqcn=DEFAULT_PROFILE),
}
"""`without=NAME`: one mechanism of a profile's base point (`study regime --profile`) set back
to the project's own default, the rest kept, so a grid shows which mechanism carries a
figure: the all-reduce's parts, step completion by the sender's ACK, the reduction's memory
time, control queued behind data, an ACK per packet, a path per message, a CNP per mark, the
payload, the window and the DCQCN profile (the DCQCN state is the `dcqcn-state` axis) (docs/astra-sim.md)."""


AXES: dict[str, Callable[[RunConfig, Any], RunConfig]] = {
    "step/buffer": with_step_over_buffer,
    "dcqcn": lambda config, profile: replace(config, dcqcn=profile),
    "fabric": with_fabric,
    "window": lambda config, window: with_nic(config, window=window),
    "dcqcn-state": lambda config, state: with_nic(config, dcqcn_state=state),
    "tp": lambda config, phase: replace(config, workload=replace(config.workload, tp_phase=phase)),
    "profile": with_profile,
    "jitter": lambda config, frames: replace(config, jitter_frames=frames),
    "without": lambda config, mechanism: MECHANISMS[mechanism](config),
}
"""What each axis changes in a run's configuration."""
NUMERIC: dict[str, tuple[float, float]] = {"step/buffer": (0.0, 1e3), "jitter": (0.0, 1e3)}
"""The axes whose value is a number, and the open interval it must lie in."""


@dataclass(frozen=True)
class Cell:
    axis: str
    value: Any

    @property
    def name(self) -> str:
        if self.axis == "base":
            return "base"
        value = f"{self.value:g}" if isinstance(self.value, float) else self.value
        return f"{self.axis}={value}"

    def config(self, base: RunConfig, policy: str, seed: int) -> RunConfig:
        config = replace(base, policy=policy, seed=seed)
        return config if self.axis == "base" else AXES[self.axis](config, self.value)


BASE = Cell("base", None)
DEFAULT_GRID: tuple[Cell, ...] = (
    BASE,
    *(Cell("step/buffer", r) for r in (0.25, 0.5, 2.0, 4.0, 8.0)),
    *(Cell("dcqcn", p) for p in PROFILES if p != DEFAULT_PROFILE),
    Cell("fabric", "note-1to1"),
    Cell("window", "bdp"),
    Cell("dcqcn-state", "qp"),
    Cell("tp", "overlap"),
    *(Cell("profile", name) for name in REGIME_PROFILES),
    Cell("jitter", 1.0),
)
"""The base point (the note's 4:1 fabric, paper profile, no window, DCQCN state per message,
tensor-parallel traffic in its own phase, a ring step about its 4 MiB queue, exact timing)
and one change from it per cell; `jitter=1` makes each host frame up to one frame time late,
which breaks the phase lock of equally paced senders (docs/simulation.md)."""
CHOICES: dict[str, tuple[str, ...]] = {
    "dcqcn": PROFILES,
    "fabric": tuple(PRESETS),
    "window": WINDOWS,
    "dcqcn-state": DCQCN_STATES,
    "tp": TP_PHASES,
    "profile": tuple(REGIME_PROFILES),
    "without": tuple(MECHANISMS),
}
"""The values each named axis takes (the ring step's is any ratio)."""


def parse_cells(text: str) -> tuple[Cell, ...]:
    """Cells named as the table names them (`base`, `step/buffer=2`, `dcqcn=nic`, ...)."""
    cells = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        if name == "base":
            cells.append(BASE)
            continue
        axis, sep, value = name.partition("=")
        if not sep or axis not in AXES:
            raise RunError(f"--cells: {name!r} is not base or AXIS=VALUE with AXIS one of "
                           f"{', '.join(AXES)}")  # fmt: skip
        if axis in NUMERIC:
            low, high = NUMERIC[axis]
            try:
                number_ = float(value)
            except ValueError:
                raise RunError(f"--cells: {name!r}: the value must be a number") from None
            if not low < number_ < high:
                raise RunError(f"--cells: {name!r}: the value must lie in ({low:g}, {high:g})")
            cells.append(Cell(axis, number_))
        elif value not in CHOICES[axis]:
            raise RunError(f"--cells: {name!r}: {axis} is one of {', '.join(CHOICES[axis])}")
        else:
            cells.append(Cell(axis, value))
    if not cells:
        raise RunError("--cells is empty")
    return tuple(dict.fromkeys(cells))


def plan(
    cells: Sequence[Cell], base: RunConfig, seeds: Sequence[int]
) -> list[tuple[Cell, RunConfig]]:
    """Every run, cell by cell; FabricError, naming the cell, for a cell the base cannot take
    (a data queue under four frames at this byte scale)."""
    out = []
    for c in cells:
        try:
            out += [(c, c.config(base, p, s)) for p in POLICIES for s in seeds]
        except FabricError as err:
            raise FabricError(f"cell {c.name}: {err}") from None
    return out


def feasible(cells: Sequence[Cell], base: RunConfig) -> tuple[list[Cell], list[str]]:
    """The cells the base can take, and a reason for each it cannot."""
    kept, left_out = [], []
    for c in cells:
        try:
            c.config(base, TIGHT, 1)
        except FabricError as err:
            left_out.append(f"{c.name} ({err})")
        else:
            kept.append(c)
    return kept, left_out


@dataclass
class CellFigures:
    """One cell's figures, each per seed."""

    cell: Cell
    config: RunConfig
    slack: dict[int, float | None]
    change_pct: dict[int, float | None]
    given_up_pct: dict[int, float | None]
    trim_tight_pct: dict[int, float | None]
    trim_forgive_pct: dict[int, float | None]
    cnps_ratio: dict[int, float | None]
    rtos_ratio: dict[int, float | None]


COLUMNS: tuple[tuple[str, str], ...] = (
    ("slack", "tight AR / bound"),
    ("change_pct", "forgive vs tight %"),
    ("given_up_pct", "given up %"),
    ("trim_tight_pct", "trim % tight"),
    ("trim_forgive_pct", "trim % forgive"),
    ("cnps_ratio", "CNPs / tight's"),
    ("rtos_ratio", "RTOs / tight's"),
)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def figures(
    planned: Sequence[tuple[Cell, RunConfig]], results: Sequence[RunResult]
) -> list[CellFigures]:
    """Per cell, each figure per seed, forgive paired with tight of the same seed."""
    runs: dict[Cell, dict[str, dict[int, tuple[RunConfig, RunResult]]]] = {}
    for (cell, config), result in zip(planned, results, strict=True):
        runs.setdefault(cell, {}).setdefault(config.policy, {})[config.seed] = (config, result)
    out = []
    for cell, by_policy in runs.items():
        tight, forgive = by_policy.get(TIGHT, {}), by_policy.get(FORGIVE, {})
        seeds = sorted(set(tight) & set(forgive))
        fig = CellFigures(cell, next(iter(tight.values()))[0], {}, {}, {}, {}, {}, {}, {})
        for s in seeds:
            (tc, t), (_, f) = tight[s], forgive[s]
            tm, fm = t.metrics(), f.metrics()
            ar = tm["allreduce_noncritical_ms"]
            fig.slack[s] = None if ar is None else ar / 1e3 / t.time_scale / allreduce_bound_s(tc)
            fig.change_pct[s] = 100.0 * (f.training_time_s - t.training_time_s) / t.training_time_s
            fig.given_up_pct[s] = fm["forgiven_pct"]
            fig.trim_tight_pct[s] = tm["trim_rate_pct"]
            fig.trim_forgive_pct[s] = fm["trim_rate_pct"]
            fig.cnps_ratio[s] = _ratio(f.cnps, t.cnps)
            fig.rtos_ratio[s] = _ratio(f.rtos, t.rtos)
        out.append(fig)
    return out


def median(values: Mapping[int, float | None]) -> float | None:
    present = [x for x in values.values() if x is not None]
    return statistics.median(present) if present else None


def spread(values: Mapping[int, float | None]) -> str:
    present = [x for x in values.values() if x is not None]
    if not present:
        return "-"
    lo, hi = number(min(present)), number(max(present))
    return f"{lo if lo == hi else f'{lo}..{hi}'} ({len(present)})"


def table_rows(cells: Sequence[CellFigures]) -> list[list[str]]:
    return [
        [
            c.cell.name,
            f"{ring_step_bytes(c.config) / c.config.fabric.switch.data_queue_bytes:.3g}",
            *(spread(getattr(c, key)) for key, _ in COLUMNS),
        ]
        for c in cells
    ]


HEADER = ["cell", "ring step / buffer", *(title for _, title in COLUMNS)]
MEANINGS = {
    "cell": "what the cell changes from the base point (base: nothing)",
    "ring step / buffer": "the bytes one ring step puts on the busiest leaf uplink over the "
    "port's data queue",
    "tight AR / bound": "tight's non-critical all-reduce time over its line-rate bound: the "
    f"baseline's slack (the note's: {NOTE_SLACK:.2f})",
    "forgive vs tight %": "forgive's training time against tight's of the same seed, percent; "
    "negative when forgive is faster (the plots use the same sign)",
    "given up %": "gradient bytes forgive forgave, percent of those sent",
    "trim % tight": "DATA packets trimmed under tight, percent of those sent",
    "trim % forgive": "the same under forgive",
    "CNPs / tight's": "forgive's congestion notifications over tight's",
    "RTOs / tight's": "forgive's retransmission timeouts over tight's",
}
"""What each column of HEADER means, as the page defines it; every figure is given per seed as
lo..hi (n), n the seeds that gave it a value."""


def format_table(cells: Sequence[CellFigures]) -> str:
    return render_table([HEADER, *table_rows(cells)])


def fit(cells: Sequence[CellFigures]) -> tuple[float, float, float] | None:
    """Least squares of the median saving (percent, positive = faster) on the median slack
    over the cells: (slope, intercept, RMS residual), or None with fewer than two points."""
    points = [
        (x, -y)
        for c in cells
        if (x := median(c.slack)) is not None and (y := median(c.change_pct)) is not None
    ]
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return None
    xs, ys = zip(*points, strict=True)
    slope, intercept = statistics.linear_regression(xs, ys)
    rms = statistics.fmean((y - (slope * x + intercept)) ** 2 for x, y in points) ** 0.5
    return slope, intercept, rms


def to_json(cells: Sequence[CellFigures], meta: Mapping[str, Any]) -> dict[str, Any]:
    fitted = fit(cells)
    return {
        **meta,
        "note": {"slack": NOTE_SLACK, "saving_pct": list(NOTE_SAVING)},
        "fit": None
        if fitted is None
        else dict(
            zip(("slope_pct_per_slack", "intercept_pct", "rms_residual_pct"), fitted, strict=True)
        ),
        "cells": [
            {
                "cell": c.cell.name,
                "axis": c.cell.axis,
                "value": c.cell.value,
                "ring_step_over_buffer": ring_step_bytes(c.config)
                / c.config.fabric.switch.data_queue_bytes,
                "allreduce_bound_ms": 1e3 * allreduce_bound_s(c.config),
                **{key: {str(s): x for s, x in getattr(c, key).items()} for key, _ in COLUMNS},
                "median": {key: median(getattr(c, key)) for key, _ in COLUMNS},
            }
            for c in cells
        ],
    }
