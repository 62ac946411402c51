"""What `forgive impact` runs: the comparisons, the drift experiment and the detector replay.

Every training of one seed starts from the same weights and draws the same
minibatches, so two comparisons of a seed differ only in the loss they apply.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from host_agent.core import AccordionDetector
from host_agent.policies import DEFAULT_POLICY, P_HIGH, P_LOW
from impact.config import ImpactConfig, ModelSpec
from impact.drift import (
    lag_prediction,
    paper_constant,
    review_constant,
    simulate_independent_updates,
    steady_ratio,
    step_ratios,
    update_correlations,
)
from impact.masks import (
    COMPARISONS,
    NO_LOSS,
    RECORDED,
    StepLoss,
    comparison_loss,
    lost_bytes,
    uniform_packets,
)
from impact.model import Digits, load_digits
from impact.replicas import SHARDED, Replicas
from impact.ring import RENORMALISE, TREATMENTS
from runs.results import RunResult
from workload.lossrecord import Layout, LossRecord, LossRecordError
from workload.rank import classify

MAX_LAG = 30
"""Update correlations beyond this many steps are taken as zero in the lag prediction."""
SIGMA_WINDOW = 3
"""Steps over which sigma^2 is averaged for each step's E[D^2] / sigma^2 (drift.trailing_sigma2)."""
IID = "iid-updates"
INDEPENDENT = "independent"
INDEPENDENT_RING = "independent-ring"
DRIFT_ARMS = (IID, INDEPENDENT, INDEPENDENT_RING, RECORDED)
"""The drift experiment's arms, all in the sharded scheme with the previous copy kept:
i.i.d. N(0, 1) updates and no model, each rank losing packets of its owner's
broadcast independently (the analyses' own setting); the model's real updates
under the same drops; the same drops per ring hop, each rank forwarding what it
holds; the recorded masks on the ring."""


class ImpactError(RuntimeError):
    """Results that cannot be replayed (no loss record, runs that disagree)."""


@dataclass(frozen=True)
class Replay:
    """A training seed and the recorded run whose loss it replays."""

    seed: int
    run_policy: str
    run_seed: int
    record: LossRecord


def choose_runs(
    runs: Sequence[RunResult], policy: str | None, seeds: Sequence[int]
) -> list[Replay]:
    """Per training seed, the run of `policy` with that seed, else the recorded runs in turn."""
    recorded = [r for r in runs if r.loss is not None]
    if not recorded:
        raise ImpactError("no run in these results has a loss record (recorded before it existed?)")
    policies = sorted({r.policy for r in recorded})
    if policy is None:
        if len(policies) == 1:
            policy = policies[0]
        elif DEFAULT_POLICY in policies:
            policy = DEFAULT_POLICY
        else:
            raise ImpactError(
                f"several policies recorded ({', '.join(policies)}): pick one with --policy"
            )
    chosen = sorted((r for r in recorded if r.policy == policy), key=lambda r: r.seed)
    if not chosen:
        raise ImpactError(f"no run of policy {policy!r} (recorded: {', '.join(policies)})")
    try:
        records = {r.seed: LossRecord.from_json(r.loss) for r in chosen}
    except LossRecordError as err:
        raise ImpactError(f"bad loss record: {err}") from None
    layouts = {(rec.layout.ranks, rec.layout.steps) for rec in records.values()}
    if len(layouts) != 1:
        raise ImpactError("the chosen runs differ in ranks or steps; replay them separately")
    order = sorted(records)
    return [
        Replay(seed, policy, s, records[s])
        for i, seed in enumerate(seeds)
        for s in [seed if seed in records else order[i % len(order)]]
    ]


@dataclass
class Results:
    config: dict[str, Any]
    replays: list[dict[str, Any]]
    trainings: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    """'comparison/treatment' (or 'no-loss') -> seed -> trace and the loss it applied."""
    drift: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    detector: dict[int, dict[str, Any]] = field(default_factory=dict)
    elapsed_s: float = 0.0


def training_key(comparison: str, treatment: str) -> str:
    return NO_LOSS if comparison == NO_LOSS else f"{comparison}/{treatment}"


def _train(
    replay: Replay,
    spec: ModelSpec,
    data: Digits,
    losses: dict[int, StepLoss],
    treatment: str,
    **kw: Any,
) -> Replicas:
    replicas = Replicas(spec, data, replay.record.layout, replay.seed, **kw)
    for step in sorted(losses):
        replicas.step(losses[step], treatment)
    return replicas


def _applied(losses: dict[int, StepLoss], layout: Layout) -> list[float]:
    return [lost_bytes(losses[s]) / layout.step_bytes() for s in sorted(losses)]


def all_gather_rate(losses: dict[int, StepLoss], layout: Layout) -> float:
    """Lost share of the all-gather bytes over the given steps (the drift analyses' p)."""
    n = layout.ranks
    sizes = [size for _, size in layout.chunks]
    lost = sum(
        hi - lo
        for loss in losses.values()
        for (j, _), ranges in loss.items()
        if j >= n - 1
        for lo, hi in ranges
    )
    per_step = sum(
        sizes[layout.chunk(src, j)] for j in range(n - 1, 2 * (n - 1)) for src in range(n)
    )
    return lost / (per_step * len(losses)) if losses else 0.0


def drift_summary(
    drift: list[float],
    update_sq: list[float],
    updates: list[torch.Tensor] | None,
    p: float,
    use: Sequence[int],
) -> dict[str, Any]:
    """A drift trace against both closed forms and against the lag model with the update
    correlations measured over the steps in `use` (uncorrelated when `updates` is None, as
    for i.i.d. updates)."""
    rho = update_correlations([updates[i] for i in use], MAX_LAG) if updates else [1.0]
    return {
        "p": p,
        "drift": drift,
        "update_sq": update_sq,
        "ratio": step_ratios(drift, update_sq, SIGMA_WINDOW),
        "steps_averaged": [i + 1 for i in use],
        "measured_ratio": steady_ratio(drift, update_sq, SIGMA_WINDOW, use),
        "paper_ratio": paper_constant(p),
        "review_ratio": review_constant(p),
        "lag_correlated_ratio": lag_prediction(p, rho),
        "update_correlation": rho,
    }


def detector_replay(norms: Sequence[float], record: LossRecord) -> dict[str, Any]:
    """Accordion over the training's gradient norms against the run's own schedule, step by
    step: the steps the run classified critical, as its record says (a run made with
    `--critical-steps` has its own, not the note's default).

    Cost: a step Accordion calls non-critical where the run's schedule says critical
    gets the budget of P_high instead of P_low; one it calls critical loses the
    forgiveness the run had there beyond P_low. Forgiven bytes on a newly
    non-critical step are estimated at the run's mean rate on non-critical steps.
    """
    steps = record.layout.steps
    run_critical = {c.step: c.critical for c in record.steps}
    accordion = AccordionDetector()
    ours = [classify(accordion, list(norms), s) for s in range(1, steps + 1)]
    theirs = [run_critical[s] for s in range(1, steps + 1)]
    step_bytes = record.layout.step_bytes()
    quiet = [record.step_rate(s) for s in range(1, steps + 1) if not theirs[s - 1]]
    usual = sum(quiet) / len(quiet) if quiet else 0.0
    budget = forgiven = 0.0
    for s in range(1, steps + 1):
        if ours[s - 1] == theirs[s - 1]:
            continue
        rate = record.step_rate(s)
        if theirs[s - 1]:  # now non-critical
            budget += (P_HIGH - P_LOW) * step_bytes
            forgiven += max(usual - rate, 0.0) * step_bytes
        else:  # now critical
            budget -= (P_HIGH - P_LOW) * step_bytes
            forgiven -= max(rate - P_LOW, 0.0) * step_bytes
    differ = [s for s in range(1, steps + 1) if ours[s - 1] != theirs[s - 1]]
    return {
        "norms": list(norms),
        "accordion_critical": [s for s in range(1, steps + 1) if ours[s - 1]],
        "run_critical": [s for s in range(1, steps + 1) if theirs[s - 1]],
        "differ": differ,
        "missed": [s for s in differ if theirs[s - 1]],
        "budget_change_bytes": budget,
        "forgiven_change_bytes": forgiven,
        "run_gradient_bytes": step_bytes * steps,
    }


def run(
    config: ImpactConfig,
    replays: Sequence[Replay],
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
    data: Digits | None = None,
) -> Results:
    """Every comparison and treatment per seed, the drift arms, the detector replay."""
    config.validate()
    torch.set_num_threads(config.threads)
    started = time.monotonic()
    data = data or load_digits()
    results = Results(
        config=asdict(config),
        replays=[{"seed": r.seed, "policy": r.run_policy, "run_seed": r.run_seed} for r in replays],
    )
    jobs = [(c, t) for c in COMPARISONS for t in ((RENORMALISE,) if c == NO_LOSS else TREATMENTS)]
    total = len(jobs) * len(replays) + len(DRIFT_ARMS) * len(replays)
    done = 0
    for replay in replays:
        for comparison, treatment in jobs:
            losses = comparison_loss(comparison, replay.record, replay.seed)
            t0 = time.monotonic()
            replicas = _train(replay, config.spec, data, losses, treatment)
            done += 1
            tr = replicas.trace
            key = training_key(comparison, treatment)
            results.trainings.setdefault(key, {})[replay.seed] = {
                **asdict(tr),
                "applied_loss": _applied(losses, replay.record.layout),
            }
            progress(
                f"[{done}/{total}] seed {replay.seed} {key}: test loss {tr.test_loss[-1]:.4f}, "
                f"accuracy {100 * tr.test_accuracy[-1]:.1f} %, {time.monotonic() - t0:.1f} s"
            )
        norms = results.trainings[NO_LOSS][replay.seed]["grad_norm"]
        results.detector[replay.seed] = detector_replay(norms, replay.record)
        layout = replay.record.layout
        independent = {
            s: uniform_packets(layout, s, config.drift_p, f"{replay.seed}:drift")
            for s in range(1, config.drift_steps + 1)
        }
        recorded = comparison_loss(RECORDED, replay.record, replay.seed)
        steady = range(config.burn_in, config.drift_steps)
        quiet = [
            s - 1 for s in range(1, layout.steps + 1) if not replay.record.steps[s - 1].critical
        ]
        for arm in DRIFT_ARMS:
            t0 = time.monotonic()
            if arm == RECORDED and not quiet:
                # The recorded arm averages over non-critical steps; a run whose every
                # step is critical (as short runs are) has none, so it is left out.
                done += 1
                progress(
                    f"[{done}/{total}] seed {replay.seed} drift, {arm}: not measured, every one "
                    f"of the run's {layout.steps} steps is critical"
                )
                continue
            if arm == IID:
                probe = Replicas(config.spec, data, layout, replay.seed, evaluate=False)
                drift, update_sq = simulate_independent_updates(
                    probe.ring, config.drift_p, config.drift_steps, replay.seed
                )
                summary = drift_summary(drift, update_sq, None, config.drift_p, steady)
            else:
                losses = recorded if arm == RECORDED else independent
                use = quiet if arm == RECORDED else steady
                p = (
                    all_gather_rate({i + 1: losses[i + 1] for i in use}, layout)
                    if arm == RECORDED
                    else config.drift_p
                )
                replicas = _train(
                    replay, config.spec, data, losses, RENORMALISE, scheme=SHARDED,
                    evaluate=False, keep_updates=True, direct=arm == INDEPENDENT,
                )  # fmt: skip
                tr = replicas.trace
                summary = drift_summary(tr.drift, tr.update_sq, replicas.updates, p, use)
            done += 1
            results.drift.setdefault(arm, {})[replay.seed] = summary
            progress(
                f"[{done}/{total}] seed {replay.seed} drift, {arm} (p {summary['p']:.3f}): "
                f"E[D^2]/sigma^2 {summary['measured_ratio']:.3f}; paper {summary['paper_ratio']:.3f}, "
                f"review {summary['review_ratio']:.3f}, lag model with the measured update "
                f"correlations {summary['lag_correlated_ratio']:.3f} ({time.monotonic() - t0:.1f} s)"
            )
    results.elapsed_s = time.monotonic() - started
    return results
