"""The runs the note's Results section rests on, and the two experiments it leaves open.

Each variant is one policy on one of two fabrics (the worst fabric, or the same
fabric without oversubscription), possibly with a second job beside it or with a
detector that errs on purpose. The names are the study's row labels and its
cache's; `study.runs` turns a variant and a seed into a RunConfig for an engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from host_agent.core import DEFAULT_CONTROL, StaticSchedule

WORST = "worst"
NONBLOCKING = "nonblocking"
CRITICAL_MISSED = "critical-missed"
"""The detector takes every critical step of the schedule as non-critical."""
FALSE_CRITICAL = "false-critical"
"""The detector takes every other non-critical step as critical."""
COMPANION_POLICY = "dcqcn"
"""The second job obeys congestion control throughout and tolerates no loss."""


@dataclass(frozen=True)
class Variant:
    name: str
    policy: str
    fabric: str = WORST
    companion: str | None = None
    """Policy of a second job of the same shape on the fabric's other hosts, or None."""
    misclassify: str | None = None
    """CRITICAL_MISSED or FALSE_CRITICAL: which verdicts the detector gets wrong, or None."""
    baseline_seeds: bool = False
    """Run on the baseline seeds (the note gives plain DCQCN five, so its tight baseline
    needs them too) rather than the study's seeds."""
    dcqcn: str | None = None
    """The DCQCN profile this variant runs instead of the study's (congestion control off
    in `forgive study calibrate`), or None."""
    cc: str = DEFAULT_CONTROL
    """The senders' congestion control (host_agent.core.CONTROLS)."""


TIGHT = "tight"
FORGIVE = "forgive"
FULL_BUDGET = "forgive-full-budget"
P025 = "forgive-P0.25"
P0 = "forgive-P0"
NO_EXEMPTION = "forgive-no-exemption"
SHED = "shed"
LOOSE = "loose"
DCQCN = "dcqcn"
NB_TIGHT = "nonblocking:tight"
NB_FORGIVE = "nonblocking:forgive"
CO_TIGHT = "second-job:tight"
CO_FORGIVE = "second-job:forgive"
MISSED = "detector:critical-missed"
FALSE = "detector:false-critical"

VARIANTS: tuple[Variant, ...] = (
    Variant(TIGHT, "tight", baseline_seeds=True),
    Variant(FORGIVE, "forgive"),
    Variant(FULL_BUDGET, "forgive-full-budget"),
    Variant(P025, "forgive-P0.25"),
    Variant(P0, "forgive-P0"),
    Variant(NO_EXEMPTION, "forgive-no-exemption"),
    Variant(SHED, "shed"),
    Variant(LOOSE, "loose"),
    Variant(DCQCN, "dcqcn", baseline_seeds=True),
    Variant(NB_TIGHT, "tight", fabric=NONBLOCKING),
    Variant(NB_FORGIVE, "forgive", fabric=NONBLOCKING),
    Variant(CO_TIGHT, "tight", companion=COMPANION_POLICY),
    Variant(CO_FORGIVE, "forgive", companion=COMPANION_POLICY),
    Variant(MISSED, "forgive", misclassify=CRITICAL_MISSED),
    Variant(FALSE, "forgive", misclassify=FALSE_CRITICAL),
)
NSCC_TIGHT = "nscc:tight"
NSCC_FORGIVE = "nscc:forgive"
NSCC_P0 = "nscc:forgive-P0"
NSCC_PLAIN = "nscc:plain"
NSCC_VARIANTS: tuple[Variant, ...] = (
    Variant(NSCC_TIGHT, "tight", cc="nscc"),
    Variant(NSCC_FORGIVE, "forgive", cc="nscc"),
    Variant(NSCC_P0, "forgive-P0", cc="nscc"),
    Variant(NSCC_PLAIN, "dcqcn", cc="nscc"),
)
"""The headline variants again with NSCC in every sender (`forgive study note --cc nscc`);
`nscc:plain` is the `dcqcn` policy, no loss tolerance and no exemption, under NSCC."""
BY_NAME = {v.name: v for v in VARIANTS + NSCC_VARIANTS}


def critical_steps(steps: int, given: tuple[int, ...] = ()) -> frozenset[int]:
    """The schedule's critical steps: `given`, or StaticSchedule's default (1, 2, 3 and
    the last)."""
    return StaticSchedule.of(steps, given).critical_steps()


def wrong_steps(kind: str | None, steps: int, given: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The steps a misclassifying detector of `kind` gets wrong, on the schedule whose
    critical steps are `given` (empty: the default)."""
    if kind is None:
        return ()
    critical = critical_steps(steps, given)
    if kind == CRITICAL_MISSED:
        return tuple(sorted(critical))
    if kind == FALSE_CRITICAL:
        return tuple(s for s in range(1, steps + 1) if s not in critical and s % 2 == 0)
    raise ValueError(f"unknown misclassification {kind!r}")
