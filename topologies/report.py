"""A results folder: every run's record, the per-policy summary, the table and the plots.

Kept apart from `topologies.results` (the records and the table) and
`topologies.plots` (the figures), which know nothing of files or of each other
beyond the records, so that either can be rebuilt from a folder alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from topologies.results import RunResult, compare, format_table


def write_results(
    folder: Path, runs: Sequence[RunResult], order: Sequence[str] | None = None
) -> str:
    """Write runs.json, summary.json, table.txt and the plots; return the table."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runs.json").write_text(json.dumps([r.to_json() for r in runs], indent=1))
    summary = compare(runs)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    table = format_table(summary, order)
    (folder / "table.txt").write_text(table + "\n")
    from topologies.plots import plot_all  # matplotlib only once there is something to plot

    plot_all(folder, runs, order)
    return table


def read_runs(folder: Path) -> list[RunResult]:
    return [RunResult.from_json(d) for d in json.loads((folder / "runs.json").read_text())]
