"""The study's plots: all-reduce time CDFs per variant, trims per fifth of a step, and each
variant's training time against its baseline with its seed range beside the note's. Every change
in training time is plotted as the tables print it: percent against the baseline, negative when
faster."""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.transforms import Bbox

from runs.plots import save_figure
from study import figures as fg
from study import variants as v
from study.claims import BY_KEY
from study.regime import NOTE_SAVING, NOTE_SLACK

WORST_FABRIC = [x.name for x in v.VARIANTS if x.fabric == v.WORST and not x.companion]
COLORS = {x.name: plt.get_cmap("tab20")(i % 20) for i, x in enumerate(v.VARIANTS)}
"""One colour per variant, the same in every plot."""
SAVINGS: tuple[tuple[str, str, str | None], ...] = (
    (v.FORGIVE, v.TIGHT, "time.forgive"),
    (v.FULL_BUDGET, v.TIGHT, "time.full"),
    (v.P025, v.TIGHT, "time.P0.25"),
    (v.P0, v.TIGHT, "time.P0"),
    (v.NO_EXEMPTION, v.TIGHT, "time.no-exemption"),
    (v.SHED, v.TIGHT, "time.shed"),
    (v.LOOSE, v.TIGHT, "time.loose"),
    (v.DCQCN, v.TIGHT, "time.dcqcn"),
    (v.NB_FORGIVE, v.NB_TIGHT, "nb.time"),
    (v.CO_FORGIVE, v.CO_TIGHT, "second-job.first"),
    (v.MISSED, v.TIGHT, None),
    (v.FALSE, v.TIGHT, None),
)
"""(variant, baseline, the claim holding the note's range) of each bar."""


def plot_allreduce_cdfs(path: Path, runs: fg.Runs) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, critical in zip(axes, (True, False), strict=True):
        for name in WORST_FABRIC:
            times = fg.allreduce_times_ms(runs.get(name, ()), critical)
            if times:
                ys = [(i + 1) / len(times) for i in range(len(times))]
                ax.step(times, ys, where="post", label=name, color=COLORS[name])
        ax.set_xscale("log")
        ax.set_xlabel("all-reduce time per rank, fabric ms (log)")
        ax.set_title("critical steps" if critical else "non-critical steps")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of all-reduces (every rank, step and seed)")
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(fontsize=8)
    fig.suptitle("All-reduce completion times on the worst fabric")
    save_figure(fig, path)


def plot_trims_per_fifth(path: Path, runs: fg.Runs) -> None:
    """Per variant, each fifth of the steps' all-reduces (the span the loss budget is open):
    its share of the gradient bytes trimmed, and the share of those forgiven in it, summed
    over steps, ranks and seeds."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    names = []
    for name in WORST_FABRIC:
        rows = [f for r in runs.get(name, ()) if (f := fg.fifths(r)) is not None]
        if not rows:
            continue
        totals = [[sum(r[k][c] for r in rows) for c in range(3)] for k in range(fg.FIFTHS)]
        if not sum(t[fg.GRADIENT_TRIMMED] for t in totals):
            continue
        names.append((name, totals))
    width = 0.8 / max(1, len(names))
    xs = range(1, fg.FIFTHS + 1)
    for i, (name, totals) in enumerate(names):
        trimmed = sum(t[fg.GRADIENT_TRIMMED] for t in totals)
        offset = [x - 0.4 + (i + 0.5) * width for x in xs]
        shares = [100 * t[fg.GRADIENT_TRIMMED] / trimmed for t in totals]
        top.bar(offset, shares, width, label=name, color=COLORS[name])
        share = [
            100 * t[fg.FORGIVEN] / t[fg.GRADIENT_TRIMMED] if t[fg.GRADIENT_TRIMMED] else 0.0
            for t in totals
        ]
        bottom.bar(offset, share, width, label=name, color=COLORS[name])
    top.set_ylabel("% of the gradient bytes trimmed")
    top.set_title("Where in a step's all-reduce gradient trims happen (all steps, ranks, seeds)")
    if names:
        top.legend(fontsize=7, ncol=3)
    bottom.set_ylabel("% of trimmed gradient bytes forgiven")
    bottom.set_xlabel("fifth of the step's all-reduce")
    bottom.set_xticks(list(xs))
    for ax in (top, bottom):
        ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)


def plot_time_change(path: Path, runs: fg.Runs) -> None:
    """Each variant's training time against its baseline, percent, in the table's sign
    (negative: faster): the median over seeds as a bar, the seeds' range as an error bar, the
    note's range as a black line where it has one."""
    rows = []
    for name, baseline, claim in SAVINGS:
        change = [x for x in fg.time_change(runs, name, baseline).values() if x is not None]
        if change:
            rows.append((f"{name} vs {baseline}", sorted(change), claim))
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    for y, (_, change, claim) in enumerate(rows):
        mid = statistics.median(change)
        ax.barh(y, mid, color="tab:blue", alpha=0.7)
        ax.errorbar(
            mid, y, xerr=[[mid - change[0]], [change[-1] - mid]], color="tab:blue", capsize=3
        )
        note = BY_KEY[claim].note if claim else None
        if note is not None and None not in note:
            lo, hi = sorted(note)  # type: ignore[type-var]
            ax.plot([lo, hi], [y, y], color="black", lw=4, solid_capstyle="butt")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel(
        "training time against the baseline, % (negative: faster; bar: median over seeds, "
        "whiskers: range; black: the note)"
    )
    ax.set_title("Training time per variant against its baseline")
    ax.grid(alpha=0.3, axis="x")
    save_figure(fig, path)


def plot_all(folder: Path, runs: fg.Runs) -> list[Path]:
    paths = [
        folder / "allreduce_cdf.png",
        folder / "trims_per_fifth.png",
        folder / "time_vs_baseline.png",
    ]
    plot_allreduce_cdfs(paths[0], runs)
    plot_trims_per_fifth(paths[1], runs)
    plot_time_change(paths[2], runs)
    return paths


def _medians_and_ranges(per_seed: dict[int, float | None]):
    present = sorted(x for x in per_seed.values() if x is not None)
    if not present:
        return None
    mid = statistics.median(present)
    return mid, (mid - present[0], present[-1] - mid)


def _cell_points(ax, points, color: str) -> list[tuple[str, tuple[float, float]]]:
    """One point per regime cell at its medians, its seed ranges as error bars; `points` are
    (cell name, x per seed, y per seed). Returns each cell's name and point, for
    `_place_labels` once the axes hold everything else."""
    placed = []
    for name, xs, ys in points:
        x, y = _medians_and_ranges(xs), _medians_and_ranges(ys)
        if x is None or y is None:
            continue
        ax.errorbar(x[0], y[0], xerr=[[x[1][0]], [x[1][1]]], yerr=[[y[1][0]], [y[1][1]]],
                    fmt="o", capsize=3, color=color)  # fmt: skip
        placed.append((name, (x[0], y[0])))
    return placed


_LABEL_STEPS = (4, 14, 24, 36, 50, 66)
"""Distances (points) at which a label is tried around its point, nearest first."""
_LABEL_DIRECTIONS = ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))


def _place_labels(ax, placed: list[tuple[str, tuple[float, float]]]) -> list:
    """Label each point at the nearest offset where its text covers no other label, no point
    and not the legend (a cluster of cells near the same slack would otherwise print over
    itself), with a thin line back to its point once it stands off; where no offset is free,
    at the first. Called last: the boxes are measured on the drawn canvas, so the axes'
    limits must be final."""
    fig = ax.figure
    fig.tight_layout()  # as `save_figure` lays it out, so the boxes measured here hold there
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    taken = []
    for _, xy in placed:
        px, py = ax.transData.transform(xy)
        taken.append(Bbox.from_bounds(px - 4, py - 4, 8, 8))
    legend = ax.get_legend()
    if legend is not None:
        taken.append(legend.get_window_extent(renderer))
    frame = ax.get_window_extent(renderer)
    labels = []
    for name, xy in placed:
        tries = [(dx * step, dy * step) for step in _LABEL_STEPS for dx, dy in _LABEL_DIRECTIONS]
        for offset in tries:
            box = _label(ax, name, xy, offset).get_window_extent(renderer)
            ax.texts[-1].remove()  # measured without its line, which would cover its own point
            inside = frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)
            if inside and not any(box.overlaps(t) for t in taken):
                break
        else:
            offset = tries[0]
            box = _label(ax, name, xy, offset).get_window_extent(renderer)
            ax.texts[-1].remove()
        taken.append(box)
        labels.append(_label(ax, name, xy, offset, line=offset != tries[0]))
    return labels


def _label(ax, name: str, xy: tuple[float, float], offset: tuple[int, int], line: bool = False):
    """A cell's name `offset` points from its point, on the side the offset points to."""
    dx, dy = offset
    return ax.annotate(
        name, xy, fontsize=7, xytext=offset, textcoords="offset points",
        ha="left" if dx > 0 else "right" if dx < 0 else "center",
        va="bottom" if dy > 0 else "top" if dy < 0 else "center",
        arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey"} if line else None,
    )  # fmt: skip


def plot_change_vs_slack(path: Path, cells, fitted) -> None:
    """forgive's training time against tight (the table's sign: negative is faster) against
    the baseline's slack, a point per regime cell with its seed ranges, the note's own point,
    and the least-squares line (`regime.fit`, of the saving, drawn in the same sign)."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    placed = _cell_points(ax, [(c.cell.name, c.slack, c.change_pct) for c in cells], "tab:blue")
    lo, hi = NOTE_SAVING
    ax.errorbar(NOTE_SLACK, -(lo + hi) / 2, yerr=(hi - lo) / 2, fmt="*", ms=14, color="black",
                label=f"the note: slack {NOTE_SLACK:.2f}, {-hi:g} to {-lo:g} %")  # fmt: skip
    if fitted is not None:
        slope, intercept, rms = fitted
        xs = [min(1.0, *ax.get_xlim()), max(NOTE_SLACK, ax.get_xlim()[1])]
        ax.plot(xs, [-(slope * x + intercept) for x in xs], "--", color="tab:red",
                label=f"fit over the cells: {-slope:+.2f} points per unit of slack "
                f"{-intercept:+.2f}, RMS residual {rms:.2f} points")  # fmt: skip
    ax.axhline(0, color="grey", lw=0.8)
    ax.axvline(1, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("tight's non-critical all-reduce / its line-rate bound (the baseline's slack)")
    ax.set_ylabel("forgive's training time against tight, % (negative: faster)")
    ax.set_title("Where the exemption pays: forgive against tight, by the baseline's slack")
    ax.legend(fontsize=8, loc="center right")  # clear of the note's star and of the cells
    ax.grid(alpha=0.3)
    _place_labels(ax, placed)
    save_figure(fig, path)


def plot_given_up_vs_change(path: Path, cells) -> None:
    """Gradient bytes given up against forgive's change in training time, a point per cell."""
    fig, ax = plt.subplots(figsize=(8, 5))
    points = [(c.cell.name, c.change_pct, c.given_up_pct) for c in cells]
    placed = _cell_points(ax, points, "tab:green")
    lo, hi = NOTE_SAVING
    ax.plot(-(lo + hi) / 2, 7.56, "*", ms=14, color="black",
            label=f"the note: {-hi:g} to {-lo:g} %, 7.55 to 7.57 % given up")  # fmt: skip
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel("forgive's training time against tight, % (negative: faster)")
    ax.set_ylabel("gradient bytes given up, %")
    ax.set_title("What the change costs: bytes given up")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _place_labels(ax, placed)
    save_figure(fig, path)


def plot_regime(folder: Path, cells, fitted) -> list[Path]:
    paths = [folder / "change_vs_slack.png", folder / "given_up_vs_change.png"]
    plot_change_vs_slack(paths[0], cells, fitted)
    plot_given_up_vs_change(paths[1], cells)
    return paths
