"""What a study leaves for a reader beside table.txt and its JSON: `report.html`, one
self-contained page, and `runs.csv` (runs.csvfile), one row per run with every figure.

The page opens with what was run and in which regime (engine, fabrics, byte scale, steps and
which were critical, seeds), with a warning where the byte scale or the step count leaves the
regime docs/study.md validates; then how to read the verdicts, the table, what each column
means, the quotes, and every plot, each with a link to its PDF. The rest of what the JSON
records sits at the end, folded.

The page carries no script and loads nothing from outside: the plots are data: URIs, so the
file can be mailed, archived or opened offline and still shows everything. Each row of the
table carries its claim's key and each median its exact value (`data-key`, `data-value`), so a
reader's tooling, or a test, can check the page against the JSON without parsing text.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from study.claims import number

PAGE = "report.html"
VALIDATED_BYTE_SCALE = 32.0
"""The coarsest byte scale docs/study.md validates the note's regime at: a 4 MiB queue holds 32
full frames and about 3 percent of DATA is trimmed, as in the note (at bytes / 128 a third is)."""
VALIDATED_STEPS = 5
"""The fewest steps docs/study.md validates ("Five steps, one critical"): the note's share of
critical steps in a quarter of its twenty."""
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 80em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.no { background: #fde2e2; } td.yes { background: #e3f5e1; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: 0.15em 1.5em; }
dl.meta dt { font-weight: bold; } dl.meta dd { margin: 0; }
dl.columns dt { font-weight: bold; } dl.columns dd { margin: 0 0 0.4em 2em; font-size: 0.9em; }
p.warning { background: #fff4ce; border-left: 4px solid #e0a800; padding: 0.5em 1em; }
p.legend { background: #eef3fb; border-left: 4px solid #3b6fb6; padding: 0.5em 1em; }
ul.quotes { list-style: none; padding: 0; }
ul.quotes li { margin: 0.2em 0; font-size: 0.9em; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; }
"""
LABELS = {
    "study": "study",
    "engine": "engine",
    "worst_fabric": "worst fabric",
    "nonblocking_fabric": "non-oversubscribed fabric",
    "base_fabric": "base fabric",
    "byte_scale": "byte scale",
    "steps": "steps",
    "critical_steps": "critical steps",
    "seeds": "seeds",
    "baseline_seeds": "baseline seeds",
    "dcqcn": "DCQCN profile",
    "profile": "regime profile",
    "cc": "congestion control",
    "tp_phase": "tensor-parallel phase",
    "data_queue_bytes": "data queue",
    "cells_left_out": "cells left out",
    "runs_made": "runs made",
    "runs_from_cache": "runs from the cache",
    "wall_time_s": "wall time",
}
"""What the page calls each setting it shows, in the order shown; the JSON's other fields are
folded at the end."""
ENGINES = {"sim": "sim (virtual time)", "mininet": "mininet (emulation, real processes)"}


def _text(key: str, value: Any) -> str | None:
    """A setting as a reader wants it; None for one not to show (unset, or an empty list)."""
    if value is None or value == []:
        return None
    if key == "engine":
        return ENGINES.get(value, str(value))
    if key == "byte_scale":
        return f"bytes / {value:g} (every byte quantity divided by it; the packet is not)"
    if key == "wall_time_s":
        return f"{value:.0f} s"
    if key == "data_queue_bytes":
        return f"{value:,} B per port at fabric scale"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, float):
        return number(value)
    return str(value)


def setting(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The run's setting, labelled and formatted, in LABELS' order."""
    shown = [(LABELS[k], _text(k, meta[k])) for k in LABELS if k in meta]
    return [(label, text) for label, text in shown if text is not None]


def regime_warnings(meta: Mapping[str, Any]) -> list[str]:
    """Where the byte scale or the step count leaves the regime docs/study.md validates."""
    found = []
    scale, steps = meta.get("byte_scale"), meta.get("steps")
    if isinstance(scale, int | float) and scale > VALIDATED_BYTE_SCALE:
        found.append(
            f"bytes / {scale:g} is coarser than the bytes / {VALIDATED_BYTE_SCALE:g} docs/study.md "
            "validates: the queues hold fewer frames while as many senders converge on them, so "
            "more of DATA is trimmed (a third at bytes / 128, against about 3 percent at "
            "bytes / 32 and in the note), and the figures below are of another regime."
        )
    critical = meta.get("critical_steps")
    if isinstance(steps, int) and critical is not None and len(critical) >= steps:
        found.append(
            f"Every one of the {steps} steps was critical ({', '.join(map(str, critical))}): no "
            "loss budget was open, so forgive ran as tight and their rows differ by chance alone. "
            "Run more steps or name the critical ones (--critical-steps)."
        )
    elif isinstance(steps, int) and steps < VALIDATED_STEPS:
        found.append(
            f"{steps} steps is fewer than the {VALIDATED_STEPS} docs/study.md validates (one of "
            "them critical): the first steps weigh more in every figure."
        )
    return found


@dataclass
class Page:
    """One study's report.html: its parts in the order a reader needs them."""

    title: str
    header: Sequence[str]
    rows: Sequence[tuple[str, Any, Sequence[str]]]
    """(the row's key, its exact median or None, its cells)."""
    meanings: Mapping[str, str]
    """What each column of `header` means."""
    meta: Mapping[str, Any]
    """What the study's JSON records at its top: the setting is taken from it."""
    images: Sequence[Path]
    legend: Sequence[str] = ()
    """How to read the verdicts, shown before the table."""
    notes: Sequence[str] = field(default_factory=list)
    """Shown after the table: the quotes, a fit, the summary."""


def _cell(text: str, column: str) -> str:
    verdict = f' class="{text.lower()}"' if column in ("direction", "x2") else ""
    return f"<td{verdict}>{html.escape(text)}</td>"


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = html.escape(path.stem.replace("_", " "))
    pdf = path.with_suffix(".pdf")
    link = f' (<a href="{html.escape(pdf.name)}">PDF</a>)' if pdf.exists() else ""
    return (
        f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(path.name)}{link}</figcaption></figure>"
    )


def _list(items: Sequence[tuple[str, str]], css: str) -> str:
    body = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items)
    return f'<dl class="{css}">{body}</dl>'


def render(page: Page) -> str:
    """The page, self-contained."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in page.header)
    body = "\n".join(
        f'<tr data-key="{html.escape(key)}" data-value="{html.escape(json.dumps(value))}">'
        + "".join(_cell(text, column) for text, column in zip(cells, page.header, strict=True))
        + "</tr>"
        for key, value, cells in page.rows
    )
    warnings = "".join(
        f'<p class="warning">{html.escape(w)}</p>' for w in regime_warnings(page.meta)
    )
    legend = "".join(f'<p class="legend">{html.escape(line)}</p>' for line in page.legend)
    meanings = _list([(h, page.meanings[h]) for h in page.header], "columns")
    quotes = "".join(f"<li>{html.escape(q)}</li>" for q in page.notes)
    rest = [
        (str(k), json.dumps(v))
        for k, v in page.meta.items()
        if k not in LABELS and not isinstance(v, Mapping)
    ]
    recorded = (
        f"<details><summary>Everything else the JSON records</summary>{_list(rest, 'meta')}"
        "</details>\n"
        if rest
        else ""
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(page.title)}</title><style>{STYLE}</style></head><body>\n"
        f"<h1>{html.escape(page.title)}</h1>\n<h2>What was run</h2>\n"
        f"{_list(setting(page.meta), 'meta')}\n{warnings}\n"
        f"<h2>Results</h2>\n{legend}\n"
        f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>\n"
        f"<h3>The columns</h3>\n{meanings}\n"
        f'<ul class="quotes">{quotes}</ul>\n<h2>Plots</h2>\n'
        + "\n".join(_image(p) for p in page.images)
        + f"\n{recorded}</body></html>\n"
    )


def write_page(folder: Path, page: Page) -> Path:
    """report.html in `folder`."""
    path = folder / PAGE
    path.write_text(render(page), encoding="utf-8")
    return path
