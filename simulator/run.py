"""One training run in virtual time (`--engine sim`): the fabric a Mininet run would build, simulated.

The run plan (`runplan.run.plan_run`: the fabric plan, every host's endpoint
and every rank's training configuration) and the controller's description and
table entries are the ones an emulated run is given; only the engine differs
(`simulator.engine`: virtual time, no processes, no root). The run writes the
same per-host records (`<host>.train.jsonl`, `<host>.agent.jsonl`), which the
sweep collects (`runs.collect`) as it does an emulated run's, so its RunResult,
runs.json, table and plots read exactly like an emulated run's. The links the run
captures (`--pcap`) are written to pcapng as the frames cross them (simulator.capture).

The simulated fabric runs at its own rates (400 Gbps host links, no rate
scaling) with byte quantities divided by `runplan.fabric.DEFAULT_BYTE_SCALE`,
under the one scaling rule of `runplan.scaling` (`runplan.fabric.sim_scaling`);
`--host-link-mbps` and `--byte-scale` set either, so a simulation can also run
at an emulation's own rates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from common import records
from controller.topology import parse as parse_description
from host_agent.host import HostConfig
from runplan.run import EngineResult, RunError, RunPlan
from simulator.capture import Capture
from simulator.engine import Job, SimulationError, VirtualFabric, sim_endpoints, train_jobs

SAMPLE_EVERY_S = 0.5e-3
"""Fabric time between samples of the switches' counters (the trims timeline)."""
MAX_SAMPLES = 10_000
"""Samples the timeline keeps at most (even): past it every other is dropped and the interval
doubles, so a run that hangs until its timeout keeps a bounded timeline (a 20-step note run at
the first interval takes about 1,600)."""


def bounded(timeline: list[Any], every: float) -> float:
    """Thin `timeline` to every other sample once it holds more than MAX_SAMPLES, keeping the
    first and the newest at an even spacing; returns the interval to sample at from now."""
    if len(timeline) <= MAX_SAMPLES:
        return every
    del timeline[1::2]
    return 2 * every


def _unwatched(done: int, trims: int) -> None:
    """No one to tell how far the run is."""


def simulate(
    run: RunPlan,
    on_progress: Callable[[int, int], None] = _unwatched,
    label: str = "",
    engine_stats: dict | None = None,
) -> EngineResult:
    """Simulate one compiled run; the records go to the plan's files as an emulated run's
    do, and `on_progress(steps every rank has done, trims)` hears how far it is at every
    sample. Raises RunError when the run fails. `engine_stats`, if given, receives what the
    engine did: events, frames moved over links, wall and virtual seconds."""
    config = run.config
    time_scale = config.fabric.scaling.time_scale
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
                HostConfig(endpoint=first.endpoint, spray=first.spray),
            )
        )
    timeline: list[dict] = []
    with ExitStack() as stack:
        captures = []
        recorders = {}
        for wanted in run.captures:
            link = wanted.link
            capture = Capture(
                wanted.path,
                wanted.name,
                link.a,
                link.b,
                time_scale=time_scale,
                snaplen=config.captures.snaplen,
                max_frames=config.captures.max_frames,
            )
            stack.callback(capture.close)
            captures.append(capture)
            # a host link's first end is the host, whose NIC is handed frames ahead of time
            recorders[link.a, link.b] = capture.recorder(link.a, ahead=link.a_port is None)
            recorders[link.b, link.a] = capture.recorder(link.b)
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
            every = SAMPLE_EVERY_S * time_scale
            while True:
                trims = sim.fabric_total("trims")
                timeline.append(
                    {"t": sim.now, "trims": trims, "ce_marks": sim.fabric_total("ce_marks")}
                )
                on_progress(min(r.steps_done for r in ranks), trims)
                every = bounded(timeline, every)
                yield every  # a `Clock` process sleeps what it yields

        started = time.perf_counter()
        try:
            sim, ranks, _ = train_jobs(
                jobs,
                fabric,
                delay_s=run.link_delay_s,
                limit_s=config.timeout_s,
                logs=logs,
                outs=outs,
                watch=sampler,
                jitter_frames=config.jitter_frames,
                captures=recorders,
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
    if failed:
        first = failed[0]
        reason = first.failure or f"{first.totals['content_errors']} content errors, " + (
            f"{first.totals['bound_violations']} bound violations"
        )
        raise RunError(f"{len(failed)} rank(s) failed, rank {first.cfg.rank}: {reason}")
    return EngineResult(counters, timeline, captures=[c.summary() for c in captures])
