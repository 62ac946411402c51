"""Plots of a results folder (each a PNG and, beside it, a PDF for a paper): step times,
forgiveness against the budget, trims over time."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from runs.atomic import written_whole
from runs.results import RunResult


def _by_policy(
    runs: Sequence[RunResult], order: Sequence[str] | None
) -> dict[str, list[RunResult]]:
    grouped: dict[str, list[RunResult]] = defaultdict(list)
    for run in runs:
        grouped[run.policy].append(run)
    keys = [p for p in (order or sorted(grouped)) if p in grouped]
    return {p: grouped[p] for p in keys}


LINES = (
    {"ls": "-", "lw": 3.0},
    {"ls": "--", "lw": 2.2},
    {"ls": "-.", "lw": 1.6},
    {"ls": ":", "lw": 1.2},
)
"""Each policy's line, in order: thinner and broken the later it is drawn, so that a line that
coincides with an earlier one (tight's and dcqcn's when every step is critical) still shows."""


def line_style(i: int) -> dict:
    return LINES[i % len(LINES)]


def _finish(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    """Every plot of the project (runs, study, impact) laid out and saved at one resolution,
    with a PDF of it beside the PNG (vector, for a paper), its figure closed (pyplot keeps
    every open one alive)."""
    fig.tight_layout()
    try:
        for target, dpi in ((path, 110), (path.with_suffix(".pdf"), None)):
            with written_whole(target) as tmp:  # never half a file (runs.atomic)
                fig.savefig(tmp, dpi=dpi, format=target.suffix.lstrip("."))
    finally:
        plt.close(fig)


def plot_step_times(
    path: Path, runs: Sequence[RunResult], order: Sequence[str] | None = None
) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (policy, group) in enumerate(_by_policy(runs, order).items()):
        steps = sorted({s.step for r in group for s in r.steps})
        mean = [
            sum(s.duration_s for r in group for s in r.steps if s.step == k)
            / max(1, sum(1 for r in group for s in r.steps if s.step == k))
            for k in steps
        ]
        ax.plot(steps, mean, marker="o", label=policy, **line_style(i))
    critical = sorted({s.step for r in runs for s in r.steps if s.critical})
    for k in critical:
        ax.axvspan(k - 0.5, k + 0.5, color="grey", alpha=0.12, lw=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _finish(
        fig, ax, path, "training step (shaded: critical)", "step time, s (mean over seeds)",
        "Step times per policy",
    )  # fmt: skip


def plot_forgiveness(
    path: Path, runs: Sequence[RunResult], order: Sequence[str] | None = None
) -> None:
    groups = _by_policy(runs, order)
    fig, axes = plt.subplots(
        len(groups), 1, figsize=(8, 2.2 * len(groups) + 0.6), sharex=True, squeeze=False
    )
    for ax, (policy, group) in zip(axes[:, 0], groups.items(), strict=True):
        run = min(group, key=lambda r: r.seed)
        steps = [s.step for s in run.steps]
        sheds = all(s.budget_bytes == 0 for s in run.steps) and run.forgiven_bytes > 0
        label = "shed" if sheds else "forgiven"
        ax.bar(steps, [s.forgiven_bytes / 1e3 for s in run.steps], color="tab:orange", label=label)
        if not sheds:
            ax.hlines(
                [s.budget_bytes / 1e3 for s in run.steps],
                [k - 0.45 for k in steps],
                [k + 0.45 for k in steps],
                color="k",
                label="budget",
            )
        ax.set_ylabel("kB")
        what = (
            "shed by the sender's draw (no loss budget)" if sheds else "forgiven against the budget"
        )
        ax.set_title(f"{policy} (seed {run.seed}): gradient bytes per step {what}", fontsize=9)
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("training step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    save_figure(fig, path)


def last_change(timeline: Sequence[dict[str, Any]]) -> float:
    """When a run's counters last moved: after it, a timeline only holds the run's tail (the
    simulator's ranks go on acknowledging for workload.rank.LINGER_S after training)."""
    last = timeline[-1]
    for sample in reversed(timeline):
        if (sample["trims"], sample.get("ce_marks")) != (last["trims"], last.get("ce_marks")):
            return sample["t"]
    return timeline[0]["t"]


def plot_trims(path: Path, runs: Sequence[RunResult], order: Sequence[str] | None = None) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    end = 0.0
    for i, (policy, group) in enumerate(_by_policy(runs, order).items()):
        run = min(group, key=lambda r: r.seed)
        if run.timeline:
            ax.plot(
                [p["t"] for p in run.timeline],
                [p["trims"] for p in run.timeline],
                label=policy,
                **line_style(i),
            )
            end = max(end, last_change(run.timeline))
    if end > 0:
        ax.set_xlim(0, end * 1.05)  # up to the last trim or mark, not the quiet tail
    _finish(
        fig, ax, path, "time since the run started, s (the run's clock)",
        "trimmed packets, all switches (cumulative)",
        "Trims over time (lowest seed of each policy), until the counters stop",
    )  # fmt: skip


def plot_all(
    paths: Sequence[Path], runs: Sequence[RunResult], order: Sequence[str] | None = None
) -> None:
    """The results folder's three figures, to the paths its writer names (runs.report.PLOTS):
    step times, forgiveness against the budget, trims over time."""
    step_times, forgiveness, trims = paths
    plot_step_times(step_times, runs, order)
    plot_forgiveness(forgiveness, runs, order)
    plot_trims(trims, runs, order)
