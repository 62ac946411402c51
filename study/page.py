"""What a study leaves for a reader beside table.txt and study.json: `report.html`, one
self-contained page (the table with its verdicts, the quotes, the run's setting and every plot
inlined), and `runs.csv`, one row per run with every figure, for pandas or a spreadsheet.

The page carries no script and loads nothing from outside: the plots are data: URIs, so the
file can be mailed, archived or opened offline and still shows everything. Each row of the
table carries its claim's key and each median its exact value (`data-key`, `data-value`), so a
reader's tooling, or a test, can check the page against study.json without parsing text.
"""

from __future__ import annotations

import base64
import csv
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runs.results import RunResult

PAGE = "report.html"
RUNS_CSV = "runs.csv"
RUN_FIELDS = ("variant", "policy", "seed", "fabric", "time_scale")
"""The columns that say which run a row is; every figure of `RunResult.metrics` follows."""
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 80em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.no { background: #fde2e2; } td.yes { background: #e3f5e1; }
dl.meta dt { font-weight: bold; float: left; clear: left; width: 14em; }
dl.meta dd { margin-left: 15em; }
ul.quotes { list-style: none; padding: 0; }
ul.quotes li { margin: 0.2em 0; font-size: 0.9em; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; }
"""


def _cell(text: str, column: str) -> str:
    verdict = f' class="{text.lower()}"' if column in ("direction", "x2") else ""
    return f"<td{verdict}>{html.escape(text)}</td>"


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = html.escape(path.stem.replace("_", " "))
    return (
        f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(path.name)}</figcaption></figure>"
    )


def render(
    title: str,
    header: Sequence[str],
    rows: Sequence[tuple[str, Any, Sequence[str]]],
    notes: Sequence[str],
    meta: Mapping[str, Any],
    images: Sequence[Path],
) -> str:
    """The page. `rows` are (claim key, exact median or None, the table's cells)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "\n".join(
        f'<tr data-key="{html.escape(key)}" data-value="{html.escape(json.dumps(value))}">'
        + "".join(_cell(text, column) for text, column in zip(cells, header, strict=True))
        + "</tr>"
        for key, value, cells in rows
    )
    setting = "".join(
        f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(json.dumps(v))}</dd>"
        for k, v in meta.items()
        if not isinstance(v, Mapping)
    )
    quotes = "".join(f"<li>{html.escape(q)}</li>" for q in notes)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
        f'<h1>{html.escape(title)}</h1>\n<dl class="meta">{setting}</dl>\n'
        f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>\n"
        f'<ul class="quotes">{quotes}</ul>\n'
        + "\n".join(_image(p) for p in images)
        + "\n</body></html>\n"
    )


def write_page(folder: Path, *args: Any) -> Path:
    """report.html in `folder` from `render`'s arguments."""
    path = folder / PAGE
    path.write_text(render(*args), encoding="utf-8")
    return path


def run_rows(runs: Mapping[str, Sequence[RunResult]]) -> list[dict[str, Any]]:
    """One flat record per run: which run it is, then every figure it measured."""
    return [
        {
            "variant": variant,
            "policy": run.policy,
            "seed": run.seed,
            "fabric": run.fabric,
            "time_scale": run.time_scale,
            **run.metrics(),
        }
        for variant, variant_runs in runs.items()
        for run in variant_runs
    ]


def write_runs_csv(folder: Path, runs: Mapping[str, Sequence[RunResult]]) -> Path:
    """runs.csv: a header of RUN_FIELDS and the metrics' names, then a row per run; a figure a
    run has no value for is an empty cell (pandas reads it as NaN)."""
    rows = run_rows(runs)
    columns = list(RUN_FIELDS)
    for row in rows:
        columns += [k for k in row if k not in columns]
    path = folder / RUNS_CSV
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    return path
