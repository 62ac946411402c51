"""The study's table (each claim, the note's value and paragraph, this study's seed range and
the verdict), its JSON, and where they go in the output folder."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runs.csvfile import Labelled, write_runs_csv
from runs.results import render_table
from study import page
from study.claims import WITHIN, Verdict, number
from study.figures import Runs

VERDICT_RULE = (
    "direction: the median over seeds lies on the side of the reference the note claims (or "
    "inside its band); x2: the median's distance from 0 (ratios: log distance from 1) is "
    "within a factor of two of the note's mid-range value, or for a band every seed lies within "
    "twice it; n/a: the note gives no number; -: no run measured it; undefined: the runs "
    "give it no value (a ratio over zero)."
)


def _range(values: Mapping[int, float | None]) -> str:
    present = [x for x in values.values() if x is not None]
    if not present:
        return f"undefined ({len(values)})" if values else "-"
    lo, hi = number(min(present)), number(max(present))
    span = lo if lo == hi else f"{lo}..{hi}"
    return f"{span} ({len(present)})"


def _mark(value: bool | None, claimed: bool) -> str:
    if value is None:
        return "n/a" if claimed else "-"
    return "yes" if value else "NO"


def _claimed(verdict: Verdict) -> str:
    c = verdict.claim
    if c.direction == WITHIN:
        lo, hi = c.reference  # type: ignore[misc]
        return f"within {lo:g}..{hi:+g}"
    ref = c.reference
    return f"{c.direction} {ref:g}" if isinstance(ref, float | int) else f"{c.direction} [{ref}]"


HEADER = ["figure", "note", "claims", "this study (seeds)", "median", "direction", "x2"]
MEANINGS = {
    "figure": "the row's number and what it measures; [n] below quotes the note's sentence",
    "note": "the note's value or range (Results ¶n); percent changes in training time are "
    "against the baseline, negative when faster, as everywhere on this page",
    "claims": "what the note claims of the figure: its side of a reference (a number, or #n, "
    "another row's), or a band it lies within",
    "this study (seeds)": "this study's range over seeds, and in parentheses how many seeds "
    "gave it a value",
    "median": "the median over those seeds",
    "direction": "yes if the median lies on the side the note claims (or inside its band)",
    "x2": "yes if the median is within a factor of two of the note's value (the rule above)",
}
"""What each column of HEADER means, as the page defines it."""


def table_rows(verdicts: Sequence[Verdict]) -> list[list[str]]:
    """The table's cells, one row per claim (HEADER is not among them); a claim that others
    refer to is named by its row number."""
    keys = {v.claim.key: i for i, v in enumerate(verdicts, 1)}
    rows = []
    for i, v in enumerate(verdicts, 1):
        claimed = _claimed(v)
        for key, n in keys.items():
            claimed = claimed.replace(f"[{key}]", f"#{n}")
        rows.append(
            [
                f"{i:>2} {v.claim.figure}",
                v.claim.note_text(),
                claimed,
                _range(v.values),
                "-" if v.median is None else number(v.median),
                _mark(v.direction, claimed=False),
                _mark(v.magnitude, claimed=v.median is not None),
            ]
        )
    return rows


def quotes(verdicts: Sequence[Verdict]) -> list[str]:
    return [f'[{i}] {v.claim.where}: "{v.claim.quote}"' for i, v in enumerate(verdicts, 1)]


def format_table(verdicts: Sequence[Verdict]) -> str:
    """One row per claim, then the quotes by row number and the verdict rule."""
    return "\n".join(
        [render_table([HEADER, *table_rows(verdicts)]), "", *quotes(verdicts), "", VERDICT_RULE]
    )


def to_json(verdicts: Sequence[Verdict], runs: Runs, meta: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **meta,
        "variants": {name: sorted(r.seed for r in rs) for name, rs in runs.items()},
        "claims": [
            {
                "key": v.claim.key,
                "figure": v.claim.figure,
                "where": v.claim.where,
                "quote": v.claim.quote,
                "note": None if v.claim.note is None else list(v.claim.note),
                "claims": _claimed(v),
                "values": {str(seed): x for seed, x in v.values.items()},
                "median": v.median,
                "direction": v.direction,
                "magnitude": v.magnitude,
            }
            for v in verdicts
        ],
    }


def summary_line(verdicts: Sequence[Verdict]) -> str:
    judged = [v for v in verdicts if v.direction is not None]
    sized = [v for v in verdicts if v.magnitude is not None]
    return (
        f"direction reproduced on {sum(bool(v.direction) for v in judged)} of {len(judged)} "
        f"figures measured; magnitude within a factor of two on "
        f"{sum(bool(v.magnitude) for v in sized)} of {len(sized)} with a number in the note"
    )


def write(
    folder: Path,
    verdicts: Sequence[Verdict],
    runs: Runs,
    meta: Mapping[str, Any],
    labelled: Sequence[Labelled],
    title: str = "forgive study note",
) -> str:
    """table.txt, study.json, the plots, report.html and runs.csv (a row per run of
    `labelled`); returns the table."""
    folder.mkdir(parents=True, exist_ok=True)
    table = format_table(verdicts) + "\n\n" + summary_line(verdicts)
    (folder / "table.txt").write_text(table + "\n")
    (folder / "study.json").write_text(json.dumps(to_json(verdicts, runs, meta), indent=1))
    from study.plots import plot_all  # matplotlib only once there is something to plot

    images = plot_all(folder, runs)
    rows = [
        (v.claim.key, v.median, cells)
        for v, cells in zip(verdicts, table_rows(verdicts), strict=True)
    ]
    page.write_page(
        folder,
        page.Page(
            title,
            HEADER,
            rows,
            MEANINGS,
            meta,
            images,
            legend=[VERDICT_RULE, summary_line(verdicts)],
            notes=quotes(verdicts),
        ),
    )
    write_runs_csv(folder, labelled)
    return table
