"""One training run in virtual time (`--engine sim`): the fabric a Mininet run would build, simulated.

The run plan (`topologies.runplan.plan_run`: the fabric plan, every host's
endpoint and every rank's training configuration) and the controller's
description and table entries are the ones an emulated run is given; only the
engine differs (`topologies.virtual`: virtual time, no processes, no root). The run writes the
same per-host records (`<host>.train.jsonl`, `<host>.agent.jsonl`) and is
collected by the same `topologies.collect`, so its RunResult, runs.json,
table and plots read exactly like an emulated run's.

By default the simulated fabric runs at its own rates (400 Gbps host links,
no rate scaling) with byte quantities divided by `DEFAULT_BYTE_SCALE`, under
the one scaling rule of `topologies.scaling`; `--host-link-mbps` and
`--byte-scale` set either, so a simulation can also run at an emulation's
own rates.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

from common import records
from controller.topology import parse as parse_description
from host_agent.host import HostConfig
from topologies.collect import collect_run
from topologies.fabric import FabricSpec, with_scaling
from topologies.progress import Progress
from topologies.results import RunResult
from topologies.runplan import RunConfig, RunError, plan_run
from topologies.scaling import FABRIC_HOST_LINK_BPS, Scaling
from topologies.virtual import Job, SimulationError, VirtualFabric, sim_endpoints, train_jobs

DEFAULT_BYTE_SCALE = 64.0
"""Bytes divided by this at the fabric's own rates: the note's 64-rank, 20-step job then runs
within 10 minutes on one core here (benchmarks/bench_sim.py measures it)."""
LINK_DELAY_S = 1e-6
"""Propagation delay of every link at fabric scale (a few hundred metres of fibre and a
switch's port-to-port latency); stretched by the time scale like every other duration."""
SAMPLE_EVERY_S = 0.5e-3
"""Fabric time between samples of the switches' counters (the trims timeline)."""


def sim_scaling(
    spec: FabricSpec, host_link_mbps: float | None = None, byte_scale: float | None = None
) -> FabricSpec:
    """`spec` at its own rates and DEFAULT_BYTE_SCALE, unless told otherwise (the fabric file's
    [emulation] section is the emulation's, not the simulator's)."""
    scaling = Scaling(
        host_link_bps=FABRIC_HOST_LINK_BPS if host_link_mbps is None else host_link_mbps * 1e6,
        byte_scale=DEFAULT_BYTE_SCALE if byte_scale is None else byte_scale,
    )
    return with_scaling(spec, scaling)


def run_simulated(
    config: RunConfig,
    out_dir: Path,
    label: str = "",
    tty: bool | None = None,
    engine_stats: dict | None = None,
) -> RunResult:
    """Simulate one policy and seed; the records go to `out_dir` as an emulated run's do.
    Raises RunError when the run fails. `engine_stats`, if given, receives what the engine
    did: events, frames moved over links, wall and virtual seconds."""
    time_scale = config.fabric.scaling.time_scale
    run = plan_run(config, out_dir, LINK_DELAY_S * time_scale)
    fabric_plan = run.fabric
    fabric = parse_description(
        fabric_plan.controller_description(sim_endpoints(fabric_plan.switches))
    )
    index = {h.name: i for i, h in enumerate(fabric_plan.hosts)}
    jobs = []
    for j in range(len(run.jobs)):
        entries = [e for e in run.hosts if e.job == j]
        first = entries[0]  # a job's ranks share their endpoint's configuration
        jobs.append(
            Job(
                first.training,
                [index[e.name] for e in entries],
                HostConfig(endpoint=first.endpoint),
            )
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    timeline: list[dict] = []
    progress = Progress(label or f"{config.policy} seed {config.seed}", config.workload.steps)
    if tty is not None:
        progress.tty = tty
    with ExitStack() as stack:
        stack.callback(progress.close)
        logs = [
            stack.enter_context(open(run.stats_files[h.name], "w", encoding="utf-8"))
            for h in fabric_plan.hosts
        ]
        outs = [
            stack.enter_context(
                open(run.train_files[fabric_plan.hosts[i].name], "w", encoding="utf-8")
            )
            for job in jobs
            for i in job.placement
        ]

        def sampler(sim: VirtualFabric, ranks):
            while True:
                trims = sim.fabric_total("trims")
                timeline.append(
                    {"t": sim.now, "trims": trims, "ce_marks": sim.fabric_total("ce_marks")}
                )
                progress.update(min(r.steps_done for r in ranks), trims)
                yield SAMPLE_EVERY_S * time_scale  # a `Clock` process sleeps what it yields

        started = time.perf_counter()
        try:
            sim, ranks, _ = train_jobs(
                jobs,
                fabric,
                delay_s=LINK_DELAY_S * time_scale,
                limit_s=config.timeout_s,
                logs=logs,
                outs=outs,
                watch=sampler,
                jitter_frames=config.jitter_frames,
            )
        except SimulationError as err:
            raise RunError(f"{label or config.policy}: {err}") from None
        if engine_stats is not None:
            engine_stats.update(
                events=sim.events,
                frames=sim.frames_moved,
                wall_s=time.perf_counter() - started,
                virtual_s=sim.now,
            )
        failed = [r for r in ranks if r.failed]
        for h in sim.hosts:
            h.endpoint.log.write(
                records.AGENT, sim.now, **h.endpoint.summary(), unresolved_drops=h.neighbors.dropped
            )
        counters = sim.switch_totals()
        progress.update(config.workload.steps, sum(t["trims"] for t in counters.values()))
    if failed:
        first = failed[0]
        reason = first.failure or f"{first.totals['content_errors']} content errors, " + (
            f"{first.totals['bound_violations']} bound violations"
        )
        raise RunError(f"{len(failed)} rank(s) failed, rank {first.cfg.rank}: {reason}")
    return collect_run(run, counters, timeline)
