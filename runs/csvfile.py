"""runs.csv: one row per run, for pandas or a spreadsheet, beside every results folder's table
(`forgive run` and `compare`, each `forgive study`).

A row first says which run it is: its `variant` (a study's variant or regime cell, or the
policy), `fabric`, `engine`, `policy`, `seed`, `byte_scale`, `steps` and `time_scale`; then
every figure of `RunResult.metrics`, each duration in milliseconds with its clock in its name:
`_run_ms` on the run's own clock (the emulation's wall clock, the simulator's virtual clock,
both stretched by the time scale) and `_fabric_ms` on the fabric's (the run's divided by the
time scale: what the run stands for at full size, as the note reports it). A column no run has
a value for (the trims by where they happened, without asymmetric DSCP) is left out.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runplan.run import RunConfig
from runs.atomic import written_whole
from runs.results import RunResult

RUNS_CSV = "runs.csv"
RUN_FIELDS = ("variant", "fabric", "engine", "policy", "seed", "byte_scale", "steps", "time_scale")
"""The columns that say which run a row is."""
DURATIONS = {
    "training_time_s": ("training_time", 1e3),
    "allreduce_critical_ms": ("allreduce_critical", 1.0),
    "allreduce_noncritical_ms": ("allreduce_noncritical", 1.0),
    "tp_completion_ms": ("tp_completion", 1.0),
    "rtt_max_ms": ("rtt_max", 1.0),
}
"""The metrics that are durations on the run's clock: the stem of their columns and the factor
to milliseconds."""
SAME_AS = {"fabric_training_time_ms": "training_time_fabric_ms"}
"""Metrics another column already carries (under its name here)."""

Labelled = tuple[str, RunConfig, RunResult]
"""A run with its label (variant, cell or policy) and the configuration it ran."""


def run_row(label: str, config: RunConfig, result: RunResult) -> dict[str, Any]:
    """One run's row: which run it is, then its figures, durations on both clocks."""
    row: dict[str, Any] = {
        "variant": label,
        "fabric": result.fabric,
        "engine": config.engine,
        "policy": result.policy,
        "seed": result.seed,
        "byte_scale": config.fabric.scaling.byte_scale,
        "steps": config.workload.steps,
        "time_scale": result.time_scale,
    }
    for key, value in result.metrics().items():
        if key in SAME_AS:
            continue
        if key in DURATIONS:
            stem, to_ms = DURATIONS[key]
            run_ms = None if value is None else value * to_ms
            row[f"{stem}_run_ms"] = run_ms
            row[f"{stem}_fabric_ms"] = None if run_ms is None else run_ms / result.time_scale
        else:
            row[key] = value
    return row


def write_runs_csv(folder: Path, runs: Sequence[Labelled]) -> Path:
    """runs.csv in `folder`: the header, then a row per run; a figure a run has no value for
    is an empty cell (pandas reads NaN), a column empty in every row is left out."""
    rows = [run_row(*run) for run in runs]
    columns = list(RUN_FIELDS)
    for row in rows:
        columns += [k for k in row if k not in columns]
    columns = [c for c in columns if any(row.get(c) is not None for row in rows)]
    path = folder / RUNS_CSV
    with written_whole(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    return path
