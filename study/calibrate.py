"""`forgive study calibrate`: the note's calibration of its DCQCN baseline, from run records.

The note's saving comes out of its baseline's slack, so before any of its figures can be
held against a fabric, that fabric's baseline has to be the note's. The note gives its own
calibration of it: with congestion control off its worst fabric retransmitted a quarter of
its bytes; DCQCN on cut the trim rate eight to tenfold and added 18 to 25 percent to the
training time, with millions of rate cuts per run, at least 74 percent of them from marks;
and its `tight` baseline's non-critical all-reduce took 32.3 ms, about three times what the
uplinks need (`study.slack`). This command runs plain DCQCN with congestion control off and
on, and `tight` on, on the worst fabric, and judges each of those figures by the study's rule
(`study.claims`): direction, and size within a factor of two.
"""

from __future__ import annotations

from collections.abc import Callable

from runplan.run import RunConfig
from runs.results import RunResult
from study import figures as fg
from study.claims import ABOVE, Claim
from study.slack import allreduce_bound_s
from study.variants import DCQCN, TIGHT, Variant

CC_OFF = "cc-off"
CC_OFF_PROFILE = "off"

VARIANTS: tuple[Variant, ...] = (
    Variant(CC_OFF, "dcqcn", dcqcn=CC_OFF_PROFILE),
    Variant(DCQCN, "dcqcn"),
    Variant(TIGHT, "tight"),
)
"""Plain DCQCN (no loss tolerance) with congestion control off and on, and the note's tight
baseline with it on; "on" is the study's --dcqcn profile."""
BY_NAME = {v.name: v for v in VARIANTS}

INTRO = "The FORGIVE protocol ¶1"
SELECTIVE = "Selective repeat removes the loss-recovery saving ¶3"
MARKS = "Congestion-control exemption ¶2"
RESULTS = "Results ¶2"
NOTE_TIGHT_NONCRITICAL_MS = 32.3
"""The note's tight baseline: median all-reduce on non-critical steps (Results ¶2)."""
NOTE_STEPS = 20
"""The note's runs train 20 steps ("the 20-step training time", Selective repeat ¶3); a run of
plain DCQCN repeats one step's traffic, so its cuts per run are its cuts per step times 20."""
NOTE_BOUND_MS = 10.57
"""The 4:1 fabric's ring all-reduce bound at line rate (study.slack worked out for
note-4to1); the note gives the 32.3 ms, this the 'about three times'."""

CUTS = ("cuts.run", "cuts.marks")
"""The two claims of the calibration's fourth row: millions of cuts, mostly from marks."""
ROWS: tuple[tuple[str, ...], ...] = (("cc.retx",), ("cc.trim",), ("cc.time",), CUTS)
"""The four calibration rows of issue 21, each held when every claim in it holds both ways."""


def _noncritical_ms(run: RunResult) -> float | None:
    """Median non-critical all-reduce, fabric ms."""
    ms = run.metrics()["allreduce_noncritical_ms"]
    return None if ms is None else ms / run.time_scale


def claims(tight_config: RunConfig) -> tuple[Claim, ...]:
    """The calibration's claims; the slack row divides by `tight_config`'s line-rate bound."""
    bound_ms = float(f"{1e3 * allreduce_bound_s(tight_config):.3g}")

    def slack(runs: fg.Runs) -> fg.PerSeed:
        return fg.per_seed(
            runs, TIGHT, lambda r: None if (ms := _noncritical_ms(r)) is None else ms / bound_ms
        )

    def cuts_per_note_run(runs: fg.Runs) -> fg.PerSeed:
        return fg.per_seed(
            runs, DCQCN, lambda r: r.rate_cuts * NOTE_STEPS / len(r.steps) if r.steps else None
        )

    def share_from_marks(runs: fg.Runs) -> fg.PerSeed:
        return fg.metric(runs, DCQCN, "mark_cut_pct")

    def off_on(key: str) -> Callable[[fg.Runs], fg.PerSeed]:
        return lambda runs: fg.metric_ratio(runs, CC_OFF, key, DCQCN)

    return (
        Claim(
            "cc.retx", "congestion control off: bytes retransmitted, %", INTRO,
            "With packet trimming on and congestion control off, my most congested ASTRA-sim "
            "fabric hit a 25 percent retransmission rate.",
            (25.0, 25.0), ABOVE, 0.0, lambda runs: fg.metric(runs, CC_OFF, "retransmitted_pct"),
        ),
        Claim(
            "cc.trim", "trim rate, congestion control off / DCQCN on", SELECTIVE,
            "With DCQCN on, millions of rate cuts per run reduced the trim rate by a factor of "
            "eight to ten",
            (8.0, 10.0), ABOVE, 1.0, off_on("trim_rate_pct"), ratio=True, unit="",
        ),
        Claim(
            "cc.time", "DCQCN on: training time vs congestion control off, %", SELECTIVE,
            "and added 18 to 25 percent to the 20-step training time",
            (18.0, 25.0), ABOVE, 0.0, lambda runs: fg.time_change(runs, DCQCN, CC_OFF),
        ),
        Claim(
            "cuts.run", f"DCQCN on: rate cuts per {NOTE_STEPS}-step run (per step x {NOTE_STEPS})",
            SELECTIVE, "With DCQCN on, millions of rate cuts per run",
            (1e6, None), ABOVE, 0.0, cuts_per_note_run, unit="",
        ),
        Claim(
            "cuts.marks", "DCQCN on: rate cuts that answered an ECN mark, %", MARKS,
            "at least 74 percent of rate cuts in the worst fabric came from marks",
            (74.0, None), ABOVE, 74.0, share_from_marks,
        ),
        Claim(
            "slack", "tight: median non-critical all-reduce / its line-rate bound", RESULTS,
            "The median all-reduce completion time on non-critical steps fell from 32.3 ms",
            (NOTE_TIGHT_NONCRITICAL_MS / NOTE_BOUND_MS,) * 2, ABOVE, 1.0, slack,
            ratio=True, unit="",
        ),
        Claim(
            "slack.ms", "tight: median non-critical all-reduce, fabric ms",
            RESULTS,
            "The median all-reduce completion time on non-critical steps fell from 32.3 ms",
            (NOTE_TIGHT_NONCRITICAL_MS,) * 2, ABOVE, bound_ms,
            lambda runs: fg.per_seed(runs, TIGHT, _noncritical_ms), unit="ms",
        ),
    )  # fmt: skip


def rows_held(verdicts) -> tuple[int, list[str]]:
    """How many of the four calibration rows hold (direction and size, every claim in the
    row), and a line per row saying which."""
    by_key = {v.claim.key: v for v in verdicts}
    held, lines = 0, []
    for row in ROWS:
        ok = all(by_key[k].direction and by_key[k].magnitude for k in row if k in by_key)
        held += ok
        lines.append(f"{' + '.join(row)}: {'holds' if ok else 'does not hold'}")
    return held, lines
