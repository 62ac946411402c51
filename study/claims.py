"""The note's quantitative claims, each beside the figure that tests it, and the verdict rule.

A claim quotes the note (the paragraph is named by section and position, since
the note numbers none), gives its value as a range, and says what direction
it asserts: below or above a number or another claim's figure, or within a
band. The verdict on a study's per-seed values, taken at their median:

- direction: the median lies on the claimed side of the reference (for a
  reference that is another claim, of that claim's median), or inside the band;
- magnitude: the median's distance from the base (0 for changes and shares,
  1 for ratios, where distances are logarithms) is within a factor of two of
  the note's mid-range distance, on the same side; for a band, every seed lies
  within twice the band; a one-sided claim ("more than half") holds within a
  factor of two when the median is at least half as far from the base as the
  bound; a claim with no number in the note has no magnitude to meet ("n/a").

The two experiments the note names as open have no number in it; their rows
test only the direction the note expects.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from study import figures as fg
from study import variants as v

BELOW, ABOVE, WITHIN, EQUAL = "below", "above", "within", "equal"


@dataclass(frozen=True)
class Claim:
    key: str
    figure: str
    """What is measured, as the table's row says it."""
    where: str
    """The note's section and paragraph, e.g. 'Results ¶2'."""
    quote: str
    note: tuple[float | None, float | None] | None
    """The note's value as (lo, hi): lo == hi for one number, None for an open end
    ("more than half" is (None, 0.5)); None when the note gives no number."""
    direction: str
    reference: float | str | tuple[float, float]
    """A number or another claim's key (BELOW, ABOVE, EQUAL), or a band (WITHIN)."""
    compute: Callable[[fg.Runs], fg.PerSeed]
    ratio: bool = False
    """A ratio: distances are logarithms around 1."""
    unit: str = "%"

    def note_text(self) -> str:
        if self.note is None:
            if self.direction == WITHIN:
                lo, hi = self.reference  # type: ignore[misc]
                return f"~0 (read as {lo:g}..{hi:+g})"
            return "no figure"
        lo, hi = self.note
        if lo is None:
            return f"< {hi:.3g}"
        if hi is None:
            return f"> {lo:.3g}"
        return f"{lo:.3g}" if lo == hi else f"{lo:.3g}..{hi:.3g}"


def number(x: float) -> str:
    """Three significant digits, without exponents for the sizes a study shows."""
    a = abs(x)
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    if a == 0:
        return "0"
    return f"{x:.3g}"


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    values: fg.PerSeed
    median: float | None
    direction: bool | None
    magnitude: bool | None
    """None: not applicable (no number in the note) or no value measured."""


def _distance(value: float, ratio: bool) -> float | None:
    """Signed distance from the base: value - 0, or log(value / 1) for ratios."""
    if not ratio:
        return value
    return math.log(value) if value > 0 else None


def _side(direction: str, value: float, reference: float) -> bool:
    return value < reference if direction == BELOW else value > reference


def judge(claims: Sequence[Claim], runs: fg.Runs) -> list[Verdict]:
    """Every claim's per-seed values, median and verdict (the module docstring's rule)."""
    values = {c.key: c.compute(runs) for c in claims}
    medians = {key: fg.median(vals) for key, vals in values.items()}
    out = []
    for claim in claims:
        med = medians[claim.key]
        out.append(
            Verdict(
                claim,
                values[claim.key],
                med,
                None if med is None else _direction(claim, med, medians),
                None if med is None else _magnitude(claim, med, values[claim.key]),
            )
        )
    return out


def _direction(claim: Claim, med: float, medians: Mapping[str, float | None]) -> bool | None:
    ref = claim.reference
    if claim.direction == WITHIN:
        lo, hi = ref  # type: ignore[misc]
        return lo <= med <= hi
    if isinstance(ref, str):
        other = medians.get(ref)
        if other is None:
            return None
        ref = other
    if claim.direction == EQUAL:
        return math.isclose(med, ref, abs_tol=1e-9)  # type: ignore[arg-type]
    return _side(claim.direction, med, ref)  # type: ignore[arg-type]


def _magnitude(claim: Claim, med: float, values: fg.PerSeed) -> bool | None:
    if claim.note is None:
        return None
    lo, hi = claim.note
    if claim.direction == WITHIN:
        bound = max(abs(x) for x in (lo, hi) if x is not None)
        return all(abs(x) <= 2 * bound for x in values.values() if x is not None)
    if claim.direction == EQUAL:
        return math.isclose(med, lo if lo is not None else hi, abs_tol=1e-9)  # type: ignore[arg-type]
    mine = _distance(med, claim.ratio)
    if mine is None:
        return False
    if lo is None or hi is None:
        bound = _distance(hi if lo is None else lo, claim.ratio)  # type: ignore[arg-type]
        if bound is None or bound == 0:
            return None
        return mine / bound >= 0.5
    mid = _distance((lo + hi) / 2, claim.ratio)
    if mid is None or mid == 0:
        return None
    return 0.5 <= mine / mid <= 2.0


# -- the note's claims ---------------------------------------------------------------------

R = "Results ¶"
SHEDDING = "Forgiveness charges the loss budget only under congestion ¶"
LIMITS = "Limits ¶"
SELECTIVE_REPEAT = "Selective repeat removes the loss-recovery saving ¶"


def _time(variant: str, baseline: str = v.TIGHT) -> Callable[[fg.Runs], fg.PerSeed]:
    return lambda runs: fg.time_change(runs, variant, baseline)


def _metric(variant: str, key: str) -> Callable[[fg.Runs], fg.PerSeed]:
    return lambda runs: fg.metric(runs, variant, key)


def _ratio(variant: str, key: str, baseline: str = v.TIGHT) -> Callable[[fg.Runs], fg.PerSeed]:
    return lambda runs: fg.metric_ratio(runs, variant, key, baseline)


def _lost(variant: str) -> Callable[[fg.Runs], fg.PerSeed]:
    return _metric(variant, "forgiven_pct")


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "time.forgive", "forgive: training time vs tight, %", R + "2",
        "cut the 20-step training time by 16.1 to 16.7 percent",
        (-16.7, -16.1), BELOW, 0.0, _time(v.FORGIVE),
    ),
    Claim(
        "lost.forgive", "forgive: gradient bytes given up, %", R + "2",
        "gave up 7.55 to 7.57 percent of gradient bytes",
        (7.55, 7.57), ABOVE, 0.0, _lost(v.FORGIVE),
    ),
    Claim(
        "ar.noncritical", "forgive: median non-critical all-reduce / tight's", R + "2",
        "The median all-reduce completion time on non-critical steps fell from 32.3 ms to 17.4 ms",
        (17.4 / 32.3, 17.4 / 32.3), BELOW, 1.0,
        _ratio(v.FORGIVE, "allreduce_noncritical_ms"), ratio=True, unit="",
    ),
    Claim(
        "ar.critical", "forgive: median critical all-reduce vs tight, %", R + "2",
        "on critical steps it stayed at the baseline's",
        None, WITHIN, (-5.0, 5.0),
        lambda runs: fg.metric_change(runs, v.FORGIVE, "allreduce_critical_ms"),
    ),
    Claim(
        "time.dcqcn", "dcqcn: training time vs tight, %", R + "2",
        "Plain DCQCN with no loss at all stayed within -1.1 to +0.8 percent of that tight "
        "baseline over five seeds",
        (-1.1, 0.8), WITHIN, (-1.1, 0.8), _time(v.DCQCN),
    ),
    Claim(
        "time.full", "forgive-full-budget: training time vs tight, %", R + "3",
        "With the loss budget available in full at step start, the same policy cut training "
        "time by only 9.1 to 10.2 percent",
        (-10.2, -9.1), ABOVE, "time.forgive", _time(v.FULL_BUDGET),
    ),
    Claim(
        "lost.full", "forgive-full-budget: gradient bytes given up, %", R + "3",
        "for 7.9 to 8.1 percent of gradient bytes",
        (7.9, 8.1), ABOVE, "lost.forgive", _lost(v.FULL_BUDGET),
    ),
    Claim(
        "fifths.trimmed", "forgive: bytes trimmed in a step's first fifth / its last", R + "3",
        "switches trimmed seven times more bytes in the first fifth of a step than in the last "
        "fifth, 12.3 GB against 1.8 GB",
        (12.3 / 1.8, 12.3 / 1.8), ABOVE, 1.0,
        lambda runs: fg.first_last_trimmed(runs, v.FORGIVE), ratio=True, unit="",
    ),
    Claim(
        "fifths.gradient", "forgive: gradient bytes trimmed, all-reduce's first fifth / last",
        R + "3",
        "switches trimmed seven times more bytes in the first fifth of a step than in the last "
        "fifth, 12.3 GB against 1.8 GB",
        (12.3 / 1.8, 12.3 / 1.8), ABOVE, 1.0,
        lambda runs: fg.first_last_trimmed(runs, v.FORGIVE, fg.ALLREDUCE, fg.GRADIENT_TRIMMED),
        ratio=True, unit="",
    ),
    Claim(
        "fifths.first", "forgive: trimmed gradient bytes forgiven, all-reduce's first fifth, %",
        R + "3",
        "The vesting rule forgave 18 percent of the trimmed bytes that arrived in the first fifth",
        (18.0, 18.0), BELOW, "fifths.last",
        lambda runs: fg.forgiven_share(runs, v.FORGIVE, fg.FIRST),
    ),
    Claim(
        "fifths.last", "forgive: trimmed gradient bytes forgiven, all-reduce's last fifth, %",
        R + "3",
        "and 60 percent of those in the last",
        (60.0, 60.0), ABOVE, "fifths.first",
        lambda runs: fg.forgiven_share(runs, v.FORGIVE, fg.LAST),
    ),
    Claim(
        "time.P0.25", "forgive-P0.25: training time vs tight, %", R + "4",
        "training time still fell 15.8 to 16.9 percent",
        (-16.9, -15.8), BELOW, 0.0, _time(v.P025),
    ),
    Claim(
        "lost.P0.25", "forgive-P0.25: gradient bytes given up, %", R + "4",
        "the loss fell to 5.5 percent",
        (5.5, 5.5), BELOW, "lost.forgive", _lost(v.P025),
    ),
    Claim(
        "time.P0", "forgive-P0: training time vs tight, %", R + "4",
        "training time fell 15.0 to 15.7 percent at zero loss",
        (-15.7, -15.0), BELOW, 0.0, _time(v.P0),
    ),
    Claim(
        "lost.P0", "forgive-P0: gradient bytes given up, %", R + "4",
        "At P = 0 the receiver forgives nothing",
        (0.0, 0.0), EQUAL, 0.0, _lost(v.P0),
    ),
    Claim(
        "retx.P0", "forgive-P0: bytes retransmitted, %", R + "4",
        "with 9.5 to 10.5 percent of bytes retransmitted",
        (9.5, 10.5), ABOVE, "retx.P1", _metric(v.P0, "retransmitted_pct"),
    ),
    Claim(
        "retx.P1", "forgive (P = 1): bytes retransmitted, %", R + "4",
        "against 5.2 to 5.9 percent under P = 1",
        (5.2, 5.9), BELOW, "retx.P0", _metric(v.FORGIVE, "retransmitted_pct"),
    ),
    Claim(
        "retx.ratio", "bytes retransmitted, P = 0 / P = 1", R + "4",
        "Forgiveness accounted for about one point and halved the retransmission load",
        (9.5 / 5.9, 10.5 / 5.2), ABOVE, 1.0,
        lambda runs: fg.metric_ratio(runs, v.P0, "retransmitted_pct", v.FORGIVE),
        ratio=True, unit="",
    ),
    Claim(
        "split.exemption", "share of forgive's saving the exemption alone gives (P = 0), %",
        R + "4", "The exemption accounted for about 15 of the 16 points",
        (100 * 15 / 16, 100 * 15 / 16), ABOVE, 50.0,
        lambda runs: fg.exemption_share(runs, v.P0, v.FORGIVE),
    ),
    Claim(
        "split.forgiveness", "points of saving forgiveness adds to the exemption", R + "4",
        "Forgiveness accounted for about one point",
        (1.0, 1.0), ABOVE, 0.0,
        lambda runs: fg.forgiveness_points(runs, v.P0, v.FORGIVE), unit="points",
    ),
    Claim(
        "rto.ratio", "forgive: retransmission timeouts / tight's", R + "5",
        "Retransmission timeouts fell by more than half",
        (None, 0.5), BELOW, 1.0, _ratio(v.FORGIVE, "rtos"), ratio=True, unit="",
    ),
    Claim(
        "cnp.ratio", "forgive: CNPs senders received / tight's", R + "5",
        "senders received a third as many congestion notification packets",
        (1 / 3, 1 / 3), BELOW, 1.0, _ratio(v.FORGIVE, "cnps"), ratio=True, unit="",
    ),
    Claim(
        "tp.change", "forgive: tensor-parallel completion time vs tight, %", R + "5",
        "tensor-parallel completion times stayed within 4.4 percent of the baseline either way",
        (-4.4, 4.4), WITHIN, (-4.4, 4.4),
        lambda runs: fg.metric_change(runs, v.FORGIVE, "tp_completion_ms"),
    ),
    Claim(
        "trim.tight", "tight: trim rate, %", R + "6",
        "the trim rate more than doubled, from about 3 percent",
        (3.0, 3.0), ABOVE, 0.0, _metric(v.TIGHT, "trim_rate_pct"),
    ),
    Claim(
        "trim.forgive", "forgive: trim rate, %", R + "6",
        "to 6.7 to 7.4 percent",
        (6.7, 7.4), ABOVE, "trim.tight", _metric(v.FORGIVE, "trim_rate_pct"),
    ),
    Claim(
        "trim.ratio", "forgive: trim rate / tight's", R + "6",
        "the trim rate more than doubled",
        (2.0, None), ABOVE, 1.0, _ratio(v.FORGIVE, "trim_rate_pct"), ratio=True, unit="",
    ),
    Claim(
        "toggles", "forgive: budget-exhausted toggles per exempt flow", R + "6",
        "The budget-exhausted flag was set or cleared about 0.5 times per exempt flow",
        (0.5, 0.5), ABOVE, 0.0, _metric(v.FORGIVE, "toggles_per_exempt_flow"), unit="",
    ),
    Claim(
        "obey.share", "forgive: exempt flows that obeyed congestion control again, %", R + "6",
        "Of the exempt flows, 19 percent obeyed congestion control again after their exemption "
        "began",
        (19.0, 19.0), ABOVE, 0.0, lambda runs: fg.obeyed_again_pct(runs, v.FORGIVE),
    ),
    Claim(
        "obey.ms", "forgive: time each such flow obeyed again, fabric ms", R + "6",
        "for 0.17 ms each on average",
        (0.17, 0.17), ABOVE, 0.0, lambda runs: fg.obeying_again_ms(runs, v.FORGIVE), unit="ms",
    ),
    Claim(
        "bound", "every variant: loss bound held on every step (1 = yes)", R + "6",
        "The loss-budget invariant held on every step.",
        (1.0, 1.0), EQUAL, 1.0, lambda runs: fg.bound_held(runs, [x.name for x in v.VARIANTS + v.NSCC_VARIANTS]),
        unit="",
    ),
    Claim(
        "nb.trim", "non-oversubscribed, tight: trim rate, %", R + "7",
        "the tight baseline trimmed 0.02 to 0.04 percent of bytes",
        (0.02, 0.04), BELOW, "trim.tight", _metric(v.NB_TIGHT, "trim_rate_pct"),
    ),
    Claim(
        "nb.time", "non-oversubscribed: forgive's training time vs tight, %", R + "7",
        "Training time fell 4.5 to 7.5 percent",
        (-7.5, -4.5), BELOW, 0.0, _time(v.NB_FORGIVE, v.NB_TIGHT),
    ),
    Claim(
        "nb.lost", "non-oversubscribed, forgive: gradient bytes given up, %", R + "7",
        "for 1.0 to 1.3 percent of gradient bytes",
        (1.0, 1.3), BELOW, "lost.forgive", _lost(v.NB_FORGIVE),
    ),
    Claim(
        "nb.eligible_trims", "non-oversubscribed: bytes trimmed from exempt flows / tight's",
        R + "7",
        "switches trimmed ten times as many bytes from exempt flows as under the baseline",
        (10.0, 10.0), ABOVE, 1.0,
        lambda runs: fg.eligible_trimmed_ratio(runs, v.NB_FORGIVE, v.NB_TIGHT),
        ratio=True, unit="",
    ),
    Claim(
        "time.no-exemption", "forgive-no-exemption: training time vs tight, %",
        SELECTIVE_REPEAT + "2",
        "In every fabric the burst cost under 1 percent of the 20-step training time",
        (-1.0, 1.0), WITHIN, (-1.0, 1.0), _time(v.NO_EXEMPTION),
    ),
    Claim(
        "time.shed", "shed: training time vs tight, %", SHEDDING + "2",
        "sender-side shedding gave up 8.1 percent of its gradient bytes, slightly more than "
        "forgiveness, and cut training time by only 2.4 to 3.3 percent",
        (-3.3, -2.4), ABOVE, "time.forgive", _time(v.SHED),
    ),
    Claim(
        "lost.shed", "shed: gradient bytes given up, %", SHEDDING + "2",
        "gave up 8.1 percent of its gradient bytes, slightly more than forgiveness",
        (8.1, 8.1), ABOVE, "lost.forgive", _lost(v.SHED),
    ),
    Claim(
        "time.loose", "loose: training time vs tight, %", SHEDDING + "3",
        "cut training time by 2.6 to 3.9 percent, no more than shedding under the schedule",
        (-3.9, -2.6), ABOVE, "time.forgive", _time(v.LOOSE),
    ),
    Claim(
        "lost.loose", "loose: gradient bytes given up, %", SHEDDING + "3",
        "The loose baseline gave up 10.0 to 10.2 percent of gradient bytes",
        (10.0, 10.2), ABOVE, "lost.shed", _lost(v.LOOSE),
    ),
    Claim(
        "second-job.time", "second job (obeys CC): its step time while sharing, beside forgive "
        "vs beside tight, %", LIMITS + "5",
        "Such a job would lose bandwidth to exempt flows, and only a run with a second job would "
        "show whether it can tolerate that.",
        None, ABOVE, 0.0, lambda runs: fg.companion_change(runs, v.CO_FORGIVE, v.CO_TIGHT),
    ),
    Claim(
        "second-job.total", "second job: its whole training time, beside forgive vs tight, %",
        LIMITS + "5",
        "Such a job would lose bandwidth to exempt flows, and only a run with a second job would "
        "show whether it can tolerate that.",
        None, ABOVE, 0.0,
        lambda runs: fg.companion_change(runs, v.CO_FORGIVE, v.CO_TIGHT, shared=False),
    ),
    Claim(
        "second-job.first", "first job beside it: forgive's training time vs tight, %",
        LIMITS + "5",
        "Exempt flows shared the fabric with their own job's tensor-parallel traffic and one "
        "background burst, never with another job obeying congestion control.",
        None, BELOW, 0.0, _time(v.CO_FORGIVE, v.CO_TIGHT),
    ),
    Claim(
        "detector.missed", "detector takes critical steps as non-critical: their bytes lost, %",
        LIMITS + "2",
        "A detector that classifies a critical step as non-critical lets 10 percent of its "
        "gradient bytes be forgiven where the schedule allows 0.5 percent.",
        None, ABOVE, 0.5, lambda runs: fg.lost_on_true_critical_pct(runs, v.MISSED),
    ),
    Claim(
        "detector.false", "detector takes half the non-critical steps as critical: forgive's "
        "saving lost, %", LIMITS + "2",
        "One that classifies a non-critical step as critical only loses the time saving.",
        None, ABOVE, 0.0, lambda runs: fg.saving_lost_pct(runs, v.FALSE, v.FORGIVE),
    ),
    Claim(
        "detector.false.lost", "the same detector: gradient bytes given up, %", LIMITS + "2",
        "One that classifies a non-critical step as critical only loses the time saving.",
        None, BELOW, "lost.forgive", _lost(v.FALSE),
    ),
)  # fmt: skip
NSCC_LIMIT = (
    "Ultra Ethernet's default is Network Signal-based Congestion Control, which I have not "
    "modelled, so nothing here says whether the idea applies to it."
)
NSCC_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "nscc.forgive", "NSCC: forgive's training time vs tight under NSCC, %", LIMITS + "4",
        NSCC_LIMIT, None, BELOW, 0.0, _time(v.NSCC_FORGIVE, v.NSCC_TIGHT),
    ),
    Claim(
        "nscc.P0", "NSCC: forgive-P0's training time vs tight under NSCC, %", LIMITS + "4",
        NSCC_LIMIT, None, BELOW, 0.0, _time(v.NSCC_P0, v.NSCC_TIGHT),
    ),
    Claim(
        "nscc.plain", "NSCC: plain (no loss)'s training time vs tight under NSCC, %",
        LIMITS + "4", NSCC_LIMIT, None, WITHIN, (-1.1, 0.8), _time(v.NSCC_PLAIN, v.NSCC_TIGHT),
    ),
    Claim(
        "nscc.vs.dcqcn", "tight: training time under NSCC vs under DCQCN, %", LIMITS + "4",
        NSCC_LIMIT, None, BELOW, 0.0, _time(v.NSCC_TIGHT, v.TIGHT),
    ),
    Claim(
        "nscc.lost", "NSCC, forgive: gradient bytes given up, %", LIMITS + "4",
        NSCC_LIMIT, None, ABOVE, 0.0, _lost(v.NSCC_FORGIVE),
    ),
)  # fmt: skip
"""Rows a study with `--cc nscc` adds: the note has no figure for them. Their directions are
the questions asked: does forgive still save under NSCC, does NSCC's tight baseline beat
DCQCN's."""
BY_KEY = {c.key: c for c in CLAIMS + NSCC_CLAIMS}
