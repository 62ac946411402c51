"""The note's figures, computed from run records alone: one value per seed for each.

Every function takes the study's runs grouped by variant name
(`study.variants`) and returns a value per seed, or None for a seed whose runs
do not allow it (a baseline missing, nothing to divide by). Changes are taken
against the baseline run with the same seed, as the note does; percentages are
percent, ratios plain, durations in the fabric's milliseconds (the run's clock
divided by its time scale). Nothing here runs anything or reads a file, so a
table can be rebuilt from stored runs, and each function can be checked on
records made by hand.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

from runs.results import RunResult

Runs = Mapping[str, Sequence[RunResult]]
"""Runs by variant name."""
PerSeed = dict[int, float | None]
FIFTHS = 5
FIRST, LAST = 0, FIFTHS - 1
TRIMMED, GRADIENT_TRIMMED, FORGIVEN = 0, 1, 2
"""Columns of StepResult.trim_fifths (host_agent.endpoint.TRIM_FIELDS)."""
STEP, ALLREDUCE = "trim_fifths", "allreduce_trim_fifths"
"""The two spans a step's trims are cut into fifths over: the whole step, or its all-reduce
(the span the step's loss budget is open)."""


def by_seed(runs: Runs, variant: str) -> dict[int, RunResult]:
    return {r.seed: r for r in runs.get(variant, ())}


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _pct(part: float, whole: float) -> float | None:
    return None if not whole else 100.0 * part / whole


def per_seed(runs: Runs, variant: str, value: Callable[[RunResult], float | None]) -> PerSeed:
    return {seed: value(run) for seed, run in sorted(by_seed(runs, variant).items())}


def paired(
    runs: Runs,
    variant: str,
    baseline: str,
    combine: Callable[[RunResult, RunResult], float | None],
) -> PerSeed:
    """`combine(run, baseline run)` for every seed both variants ran."""
    base = by_seed(runs, baseline)
    return {
        seed: combine(run, base[seed]) if seed in base else None
        for seed, run in sorted(by_seed(runs, variant).items())
    }


def metric(runs: Runs, variant: str, key: str) -> PerSeed:
    """One of RunResult.metrics() per seed."""
    return per_seed(runs, variant, lambda r: r.metrics()[key])


def change_pct(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b:
        return None
    return 100.0 * (a - b) / b


def time_change(runs: Runs, variant: str, baseline: str = "tight") -> PerSeed:
    """20-step training time against the baseline with the same seed, %."""
    return paired(
        runs, variant, baseline, lambda r, b: change_pct(r.training_time_s, b.training_time_s)
    )


def metric_change(runs: Runs, variant: str, key: str, baseline: str = "tight") -> PerSeed:
    """A metric's change against the baseline with the same seed, %."""
    return paired(
        runs, variant, baseline, lambda r, b: change_pct(r.metrics()[key], b.metrics()[key])
    )


def metric_ratio(runs: Runs, variant: str, key: str, baseline: str = "tight") -> PerSeed:
    def ratio(r: RunResult, b: RunResult) -> float | None:
        mine, theirs = r.metrics()[key], b.metrics()[key]
        return None if mine is None or theirs is None else _ratio(mine, theirs)

    return paired(runs, variant, baseline, ratio)


def fifths(run: RunResult, span: str = ALLREDUCE) -> list[list[int]] | None:
    """The run's trims per fifth of a step's span, summed over its steps; None if it has none."""
    rows = [getattr(s, span) for s in run.steps if getattr(s, span) is not None]
    if not rows:
        return None
    return [[sum(r[f][c] for r in rows) for c in range(len(rows[0][f]))] for f in range(FIFTHS)]


def first_last_trimmed(
    runs: Runs, variant: str, span: str = STEP, column: int = TRIMMED
) -> PerSeed:
    """Bytes trimmed (or, with `column`, gradient bytes trimmed) in the first fifth of a
    step's span over those in the last."""

    def value(run: RunResult) -> float | None:
        rows = fifths(run, span)
        return None if rows is None else _ratio(rows[FIRST][column], rows[LAST][column])

    return per_seed(runs, variant, value)


def forgiven_share(runs: Runs, variant: str, fifth: int) -> PerSeed:
    """Of the gradient bytes that arrived trimmed in one fifth of a step, the share the
    receiver forgave, %."""

    def value(run: RunResult) -> float | None:
        rows = fifths(run)
        return None if rows is None else _pct(rows[fifth][FORGIVEN], rows[fifth][GRADIENT_TRIMMED])

    return per_seed(runs, variant, value)


def obeyed_again_pct(runs: Runs, variant: str) -> PerSeed:
    """Of the flows that became exempt, the share that obeyed congestion control again, %."""

    def value(run: RunResult) -> float | None:
        ex = run.exemption
        return _pct(ex.get("obeyed_again_flows", 0), ex.get("exempt_flows", 0))

    return per_seed(runs, variant, value)


def obeying_again_ms(runs: Runs, variant: str) -> PerSeed:
    """Mean time a flow that obeyed again spent obeying, fabric ms."""

    def value(run: RunResult) -> float | None:
        ex = run.exemption
        mean = _ratio(ex.get("obeying_again_s", 0.0), ex.get("obeyed_again_flows", 0))
        return None if mean is None else 1e3 * mean / run.time_scale

    return per_seed(runs, variant, value)


def eligible_trimmed_ratio(runs: Runs, variant: str, baseline: str) -> PerSeed:
    """Bytes trimmed from exemption-eligible flows, against the baseline with the same seed."""
    return paired(
        runs,
        variant,
        baseline,
        lambda r, b: _ratio(r.trimmed_bytes.get("eligible", 0), b.trimmed_bytes.get("eligible", 0)),
    )


def _subtract(a: PerSeed, b: PerSeed) -> PerSeed:
    return {s: None if a[s] is None or b.get(s) is None else a[s] - b[s] for s in a}


def exemption_share(runs: Runs, exempt_only: str, full: str, baseline: str = "tight") -> PerSeed:
    """The share of the full policy's saving that the exemption alone (no forgiveness, P = 0)
    already gives, %."""
    alone, both = time_change(runs, exempt_only, baseline), time_change(runs, full, baseline)
    return {
        s: None if v is None or both.get(s) is None else _pct(v, both[s]) for s, v in alone.items()
    }


def forgiveness_points(runs: Runs, exempt_only: str, full: str, baseline: str = "tight") -> PerSeed:
    """Points of training time forgiveness saves on top of the exemption alone."""
    return _subtract(time_change(runs, exempt_only, baseline), time_change(runs, full, baseline))


def shared_steps(run: RunResult) -> dict[int, float]:
    """The second job's steps that ended while the first job was still training, with their
    durations: where it shares the fabric, whichever job finishes first."""
    if run.companion is None:
        return {}
    ends = [s.ended_s for s in run.steps if s.ended_s is not None]
    if not ends:
        return {}
    last = max(ends)
    second = RunResult.from_json(run.companion)
    return {
        s.step: s.duration_s for s in second.steps if s.ended_s is not None and s.ended_s <= last
    }


def companion_change(runs: Runs, variant: str, baseline: str, shared: bool = True) -> PerSeed:
    """The second job's time over the steps it shared the fabric in both runs (or, `shared`
    False, its whole training time), beside the variant against beside the baseline, %."""

    def combine(r: RunResult, b: RunResult) -> float | None:
        if r.companion is None or b.companion is None:
            return None
        if not shared:
            return change_pct(r.companion["training_time_s"], b.companion["training_time_s"])
        mine, theirs = shared_steps(r), shared_steps(b)
        common = sorted(set(mine) & set(theirs))
        if not common:
            return None
        return change_pct(sum(mine[k] for k in common), sum(theirs[k] for k in common))

    return paired(runs, variant, baseline, combine)


def lost_on_true_critical_pct(runs: Runs, variant: str) -> PerSeed:
    """Gradient bytes given up on the steps that really were critical (the detector's verdict
    flipped back where it erred), over those steps' expected bytes, %."""

    def value(run: RunResult) -> float | None:
        steps = [s for s in run.steps if s.critical != s.misclassified]
        return _pct(sum(s.forgiven_bytes for s in steps), sum(s.expected_bytes for s in steps))

    return per_seed(runs, variant, value)


def saving_lost_pct(runs: Runs, variant: str, reference: str, baseline: str = "tight") -> PerSeed:
    """How much of the reference policy's saving against the baseline the variant gives up, %."""
    mine, theirs = time_change(runs, variant, baseline), time_change(runs, reference, baseline)
    return {
        s: None if v is None or not theirs.get(s) else 100.0 * (v - theirs[s]) / -theirs[s]
        for s, v in mine.items()
    }


def bound_held(runs: Runs, variants: Sequence[str]) -> PerSeed:
    """1 for a seed on which every variant's loss bound held on every step, else 0."""
    out: dict[int, float | None] = {}
    for variant in variants:
        for seed, run in by_seed(runs, variant).items():
            held = run.metrics()["bound_held"]
            out[seed] = float(bool(out.get(seed, 1.0)) and held)
    return dict(sorted(out.items()))


def median(values: PerSeed) -> float | None:
    present = [v for v in values.values() if v is not None]
    return statistics.median(present) if present else None


def allreduce_times_ms(runs: Sequence[RunResult], critical: bool | None = None) -> list[float]:
    """Every rank's all-reduce time of every step (only critical or non-critical ones if
    asked), over all the runs, fabric ms: what a CDF of all-reduce times plots."""
    return sorted(
        1e3 * t / r.time_scale
        for r in runs
        for s in r.steps
        if critical is None or s.critical == critical
        for t in s.allreduce_s
    )
