"""A results folder: every run's record, the per-policy summary, the table and the plots.

Kept apart from `runs.results` (the records and the table) and
`runs.plots` (the figures), which know nothing of files or of each other
beyond the records, so that either can be rebuilt from a folder alone.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from runs.results import RunResult, compare, format_table
from runs.typed import RecordError


class FolderError(ValueError):
    """A results folder that cannot be written; the message names it and why."""


def writable_folder(folder: Path, what: str = "--out") -> Path:
    """Make `folder` and write (then remove) a file in it, so that a command finds out that
    its results cannot be kept before it starts the first run, not after the last."""
    if folder.exists() and not folder.is_dir():
        raise FolderError(f"{what} {folder}: exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".forgive-writable-"):
            pass
    except OSError as err:
        raise FolderError(f"{what} {folder}: cannot write there ({err.strerror or err})") from None
    return folder


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
    from runs.plots import plot_all  # matplotlib only once there is something to plot

    plot_all(folder, runs, order)
    return table


def read_runs(folder: Path) -> list[RunResult]:
    """The runs of a results folder; RecordError (a ValueError) names what is wrong and where."""
    path = folder / "runs.json"
    try:
        doc = json.loads(path.read_bytes())
    except RecursionError:
        raise RecordError(f"{path}: nested too deep to be a results file") from None
    except ValueError as err:  # not JSON, or not UTF-8
        raise RecordError(f"{path}: not JSON ({err})") from None
    if not isinstance(doc, list):
        raise RecordError(f"{path}: expected a list of runs, got {type(doc).__name__}")
    return [RunResult.from_json(d, f"{path}: run {i + 1}") for i, d in enumerate(doc)]
