"""What the simulator costs: packets and events per second, against the protocol core's own rate.

Run: `.venv/bin/python benchmarks/bench_sim.py [--quick]`. In one run it prints

- the protocol core's DATA-out-plus-ACK-in packets per second (bench_core's sender loop),
  the reference everything else is divided by, since this machine's load moves both;
- simulated frames per second (each frame counted once per link it crosses) and SimPy
  events per second on the note's 4:1 fabric with the note's job, and their ratio to the
  core's rate (goal: at least 0.5);
- SimPy's own share of that run: its measured cost per event (a bare event loop with the
  same number of events pending) times the run's events, over the run's wall time (the
  issue's threshold for replacing SimPy: a third);
- the wall time of the 64-rank, 20-step run at the default byte scale (goal: 10 minutes);
- how the wall time grows with ranks (8, 16, 32, 64, three steps) and with bytes (16 ranks,
  three steps, byte scale 128, 64, 32).

`--quick` skips the 20-step run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import simpy
from simpy.events import Timeout

sys.path.insert(0, str(Path(__file__).parent))
from bench_core import best_rate, sender_run

from topologies.fabric import FabricSpec
from topologies.runner import JOBS, RunConfig
from topologies.simulated import DEFAULT_BYTE_SCALE, run_simulated, sim_scaling

GOAL_RATIO = 0.5
GOAL_WALL_S = 600.0
SIMPY_LIMIT = 1 / 3


def note_fabric(ranks: int, byte_scale: float = DEFAULT_BYTE_SCALE) -> FabricSpec:
    """The note's 4:1 leaf-spine (8 hosts and 2 spines per leaf) with `ranks` hosts."""
    spec = FabricSpec(f"note-4to1-{ranks}", leaves=ranks // 8, spines=2, hosts_per_leaf=8)
    return sim_scaling(spec, byte_scale=byte_scale)


def simulate(ranks: int, steps: int, byte_scale: float = DEFAULT_BYTE_SCALE) -> dict:
    config = RunConfig(
        note_fabric(ranks, byte_scale),
        policy="forgive",
        seed=1,
        workload=replace(JOBS["note"], steps=steps),
        engine="sim",
        timeout_s=60.0,
    )
    stats: dict = {}
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = run_simulated(config, Path(out), f"{ranks} ranks", tty=False, engine_stats=stats)
        stats["total_s"] = time.perf_counter() - started
    stats["data_packets"] = result.data_packets_sent
    return stats


def simpy_cost_per_event(pending: int, events: int = 400_000) -> float:
    """Seconds SimPy takes per event (schedule, pop, one callback) with `pending` queued."""
    env = simpy.Environment()
    left = [events]

    def again(event):
        if left[0]:
            left[0] -= 1
            Timeout(env, 1e-6).callbacks.append(again)

    for _ in range(pending):
        Timeout(env, 1e-6).callbacks.append(again)
    started = time.perf_counter()
    env.run()
    return (time.perf_counter() - started) / (events + pending)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 20-step 64-rank run")
    args = parser.parse_args()
    core = best_rate(sender_run(100_000), 100_000, 3)
    print(f"protocol core, DATA out + ACK in: {core:,.0f} packets/s (the reference)")

    base = simulate(64, 2)
    frames_s = base["frames"] / base["wall_s"]
    events_s = base["events"] / base["wall_s"]
    per_event = simpy_cost_per_event(pending=200)
    share = per_event * base["events"] / base["wall_s"]
    print(
        f"64 ranks, 2 steps: {base['wall_s']:.1f} s wall, {base['data_packets']:,} DATA packets, "
        f"{base['frames']:,} frames over links, {base['events']:,} SimPy events"
    )
    print(
        f"simulated frames/s {frames_s:,.0f} ({frames_s / core:.3f} of the core's rate), "
        f"DATA packets/s {base['data_packets'] / base['wall_s']:,.0f} "
        f"({base['data_packets'] / base['wall_s'] / core:.3f}), events/s {events_s:,.0f} "
        f"({events_s / core:.3f}); goal {GOAL_RATIO} for frames: "
        f"{'met' if frames_s / core >= GOAL_RATIO else 'missed'}"
    )
    print(
        f"SimPy: {per_event * 1e6:.2f} us per event, {share:.1%} of the run "
        f"({'under' if share < SIMPY_LIMIT else 'over'} the third that would justify replacing it)"
    )

    print("growth with ranks (3 steps, byte scale 64):")
    by_ranks = {}
    for ranks in (8, 16, 32, 64):
        by_ranks[ranks] = simulate(ranks, 3)
        st = by_ranks[ranks]
        print(
            f"  {ranks:3} ranks: {st['wall_s']:7.1f} s, {st['data_packets']:>9,} DATA packets, "
            f"x{st['wall_s'] / by_ranks[8]['wall_s']:.1f} of 8 ranks"
        )
    print("growth with bytes (16 ranks, 3 steps):")
    by_bytes = {}
    for scale in (128, 64, 32):
        by_bytes[scale] = simulate(16, 3, scale)
        st = by_bytes[scale]
        print(
            f"  byte scale {scale:3}: {st['wall_s']:7.1f} s, {st['data_packets']:>9,} DATA packets, "
            f"x{st['wall_s'] / by_bytes[128]['wall_s']:.1f} of byte scale 128"
        )
    if not args.quick:
        full = simulate(64, 20)
        print(
            f"64 ranks, 20 steps, byte scale {DEFAULT_BYTE_SCALE:g}: {full['total_s']:.0f} s "
            f"({full['wall_s']:.0f} s in the engine); goal {GOAL_WALL_S:.0f} s: "
            f"{'met' if full['total_s'] <= GOAL_WALL_S else 'missed'}"
        )


if __name__ == "__main__":
    main()
