"""A results folder: every run's record, the per-policy summary, the table and the plots.

Kept apart from `runs.results` (the records and the table) and
`runs.plots` (the figures), which know nothing of files or of each other
beyond the records, so that either can be rebuilt from a folder alone.

A results folder holds one run of a command, never two: a folder that holds an earlier
one is refused unless the command is told to replace it (`earlier_run`, `clear_earlier_run`).
Every file is written whole or not at all (`runs.atomic`), and `COMPLETE` is written last,
so a reader tells a finished run from one cut short (`read_runs` refuses the latter).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from runs.atomic import is_temporary, write_whole
from runs.csvfile import RUNS_CSV, Labelled, write_runs_csv
from runs.results import RunResult, all_critical, compare, format_table
from runs.typed import RecordError

RUNS = "runs.json"
SUMMARY = "summary.json"
TABLE = "table.txt"
PLOTS = ("step_times.png", "forgiven_vs_budget.png", "trims_over_time.png")
PDFS = tuple(name.replace(".png", ".pdf") for name in PLOTS)
"""Each plot again as a PDF (runs.plots.save_figure writes it beside the PNG)."""
COMPLETE = "complete.json"
"""Written last, when every other file of the folder is whole: the run finished."""
IMPACT = "impact"
"""`forgive impact`'s folder inside the results it replays (its default --out)."""
RESULT_FILES = (RUNS, SUMMARY, TABLE, *PLOTS, *PDFS, RUNS_CSV, COMPLETE)
_RUN_FOLDER = re.compile(r".+-seed-?[0-9]+")
"""`run_folder`'s names: `<policy>-seed<n>`."""


class FolderError(ValueError):
    """A results folder that cannot be written; the message names it and why."""


def run_folder(out: Path, policy: str, seed: int) -> Path:
    """Where one run of a results folder keeps its hosts' records and logs."""
    return out / f"{policy}-seed{seed}"


def earlier_run(folder: Path) -> list[Path]:
    """What an earlier run left in `folder` (empty if nothing): its result files, its runs'
    folders (or links to the run cache), `forgive impact`'s folder and any temporary file
    of a write cut short. Nothing else in the folder is a run's."""
    if not folder.is_dir():
        return []
    return sorted(
        entry
        for entry in folder.iterdir()
        if entry.name in RESULT_FILES
        or entry.name == IMPACT
        or is_temporary(entry.name)
        or (_RUN_FOLDER.fullmatch(entry.name) and (entry.is_dir() or entry.is_symlink()))
    )


def named(entries: Sequence[Path], at_most: int = 4) -> str:
    """A folder's entries for a one-line message: the first few names, then how many more."""
    more = len(entries) - at_most
    return ", ".join(e.name for e in entries[:at_most]) + (f" and {more} more" if more > 0 else "")


def results_folder(folder: Path, what: str, replace: bool) -> Path:
    """A folder to write a run's results to, checked before the first run: refused if it
    holds an earlier run (unless `replace`, which `clear_earlier_run` then carries out),
    and made and written to (`writable_folder`). Nothing in it is touched when refused."""
    earlier = earlier_run(folder)
    if earlier and not replace:
        raise FolderError(
            f"{what} {folder}: holds an earlier run ({named(earlier)}); name another folder, "
            "or --replace to replace it"
        )
    return writable_folder(folder, what)


def clear_earlier_run(folder: Path) -> list[Path]:
    """Remove what `earlier_run` finds (a link to the run cache is unlinked, never followed);
    return what was removed."""
    earlier = earlier_run(folder)
    for entry in earlier:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return earlier


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
    folder: Path,
    runs: Sequence[RunResult],
    order: Sequence[str] | None = None,
    labelled: Sequence[Labelled] = (),
) -> str:
    """Write runs.json, summary.json, table.txt and the plots, each whole, then `COMPLETE`;
    return the table. An OSError (a full disk) leaves the files written before it whole
    and no `COMPLETE`."""
    folder.mkdir(parents=True, exist_ok=True)
    write_whole(folder / RUNS, json.dumps([r.to_json() for r in runs], indent=1))
    summary = compare(runs)
    write_whole(folder / SUMMARY, json.dumps(summary, indent=1))
    table = format_table(summary, order)
    if (note := all_critical(runs)) is not None:
        table += "\n\n" + note
    write_whole(folder / TABLE, table + "\n")
    from runs.plots import plot_all  # matplotlib only once there is something to plot

    plot_all([folder / name for name in PLOTS], runs, order)
    files = [RUNS, SUMMARY, TABLE, *PLOTS, *PDFS]
    if labelled:
        write_runs_csv(folder, labelled)
        files.append(RUNS_CSV)
    mark = {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": len(runs),
        "files": files,
    }
    write_whole(folder / COMPLETE, json.dumps(mark, indent=1))
    return table


def read_runs(folder: Path) -> list[RunResult]:
    """The runs of a results folder; RecordError (a ValueError) names what is wrong and where."""
    path = folder / RUNS
    if not (folder / COMPLETE).is_file():
        raise RecordError(
            f"{folder}: the run was cut short ({COMPLETE}, written when a run has finished, "
            "is missing)"
        )
    try:
        doc = json.loads(path.read_bytes())
    except RecursionError:
        raise RecordError(f"{path}: nested too deep to be a results file") from None
    except ValueError as err:  # not JSON, or not UTF-8
        raise RecordError(f"{path}: not JSON ({err})") from None
    if not isinstance(doc, list):
        raise RecordError(f"{path}: expected a list of runs, got {type(doc).__name__}")
    return [RunResult.from_json(d, f"{path}: run {i + 1}") for i, d in enumerate(doc)]
