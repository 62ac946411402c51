"""From the study's variants and seeds to the RunConfigs an engine runs, and back from results."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from host_agent.core import DEFAULT_PROFILE
from runplan.fabric import FabricSpec
from runplan.run import RunConfig, Workload
from runs.results import RunResult
from study.variants import NONBLOCKING, Variant, wrong_steps


@dataclass(frozen=True)
class Setup:
    """What every run of one study shares."""

    worst: FabricSpec
    nonblocking: FabricSpec
    workload: Workload
    seeds: tuple[int, ...]
    baseline_seeds: tuple[int, ...]
    switch: str = "model"
    dcqcn: str = DEFAULT_PROFILE
    timeout_s: float = 600.0
    engine: str = "sim"

    def seeds_of(self, variant: Variant) -> tuple[int, ...]:
        return self.baseline_seeds if variant.baseline_seeds else self.seeds

    def config(self, variant: Variant, seed: int) -> RunConfig:
        wl = self.workload
        workload = replace(wl, misclassify=wrong_steps(variant.misclassify, wl.steps, wl.critical))
        return RunConfig(
            self.nonblocking if variant.fabric == NONBLOCKING else self.worst,
            switch=self.switch,
            policy=variant.policy,
            seed=seed,
            workload=workload,
            timeout_s=self.timeout_s,
            dcqcn=variant.dcqcn or self.dcqcn,
            cc=variant.cc,
            companion=variant.companion,
            engine=self.engine,
        )


def plan(setup: Setup, variants: Sequence[Variant]) -> list[tuple[Variant, RunConfig]]:
    """Every run of the study, variant by variant, seed by seed; a configuration two variants
    share (none do today) is listed once, under the first."""
    seen: set[RunConfig] = set()
    out = []
    for variant in variants:
        for seed in setup.seeds_of(variant):
            config = setup.config(variant, seed)
            if config not in seen:
                seen.add(config)
                out.append((variant, config))
    return out


def by_variant(
    planned: Sequence[tuple[Variant, RunConfig]], results: Sequence[RunResult]
) -> dict[str, list[RunResult]]:
    grouped: dict[str, list[RunResult]] = {}
    for (variant, _), result in zip(planned, results, strict=True):
        grouped.setdefault(variant.name, []).append(result)
    return grouped
