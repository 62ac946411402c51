"""What the simulator costs: packets and events per second, against the protocol core's own rate.

Run: `.venv/bin/python benchmarks/bench_sim.py [--quick]`. In one run it prints

- the protocol core's DATA-out-plus-ACK-in packets per second (bench_core's sender loop),
  the reference everything else is divided by, since this machine's load moves both;
- simulated frames per second (each frame counted once per link it crosses) and engine
  events per second on the note's 4:1 fabric with the note's job, and their ratio to the
  core's rate (goal: at least 0.5);
- the event loop's own share of that run: its measured cost per event (the engine's
  `Clock` with the same number of events pending and a callback that does nothing but
  schedule the next) times the run's events, over the run's wall time;
- the wall time of the 64-rank, 20-step run at the default byte scale (goal: 10 minutes);
- how the wall time grows with ranks (8, 16, 32, 64, three steps), with the CPU time per
  DATA packet, per frame over a link and per event at each (a 64-rank DATA packet crosses
  more links and makes more events than an 8-rank one, so the last two say whether the
  engine's own cost grows), and with bytes (16 ranks, three steps, byte scale 128, 64, 32).

`--quick` skips the 20-step run. `--compare DIR` instead runs another checkout (e.g. `git
worktree add /tmp/old 1cb5452`) and this one alternately, `--rounds` times each, on the
64-rank 2-step run through `forgive run --engine sim` in a fresh process, and prints each
pair's wall and CPU time, the speed-up as a ratio of the two measured side by side, and
whether the two wrote the same runs.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_core import best_rate, sender_run

from common import native
from runplan.fabric import DEFAULT_BYTE_SCALE, FabricSpec, sim_scaling
from runplan.run import JOBS, RunConfig, plan_run
from runs.collect import collect_run
from simulator.engine import Clock
from simulator.run import simulate as simulate_run

GOAL_RATIO = 0.5
GOAL_WALL_S = 600.0
GOAL_SPEEDUP = 5.0
"""DATA packets per second against the code of issue 23's start (1cb5452), side by side."""
GOAL_FLAT = 1.3
"""Cost per DATA packet at 64 ranks over that at 8 ranks."""
ROOT = Path(__file__).resolve().parents[1]
COMPARE_RUN = [
    *("run", "--engine", "sim", "--fabric", "note-4to1", "--job", "note", "--steps", "2"),
    *("--byte-scale", f"{DEFAULT_BYTE_SCALE:g}", "--policy", "forgive", "--seed", "1"),
]
"""The 64-rank 2-step run as the CLI takes it: the interface an older checkout shares."""


def note_fabric(ranks: int, byte_scale: float = DEFAULT_BYTE_SCALE) -> FabricSpec:
    """The note's 4:1 leaf-spine (8 hosts and 2 spines per leaf) with `ranks` hosts."""
    spec = FabricSpec(f"note-4to1-{ranks}", leaves=ranks // 8, spines=2, hosts_per_leaf=8)
    return sim_scaling(spec, byte_scale=byte_scale)


def cli_run(tree: Path, out: Path, pure: bool = False) -> dict:
    """`COMPARE_RUN` with `tree`'s code in a fresh process (`pure`: with FORGIVE_PURE=1, its
    compiled build unused): its wall and CPU seconds, its DATA packets and its runs.json."""
    # The command's module where the tree has it: an older checkout's is topologies/cli.py.
    command = (
        "commands.forgive" if (tree / "commands" / "forgive.py").is_file() else "topologies.cli"
    )
    before = os.times()
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", command, *COMPARE_RUN, "--out", str(out)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree), native.PURE_ENV: "1" if pure else ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - started
    after = os.times()
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"{tree}: forgive run failed: {last}")
    runs = (out / "runs.json").read_bytes()
    return {
        "wall_s": wall,
        "cpu_s": after.children_user
        - before.children_user
        + after.children_system
        - before.children_system,
        "data_packets": json.loads(runs)[0]["data_packets_sent"],
        "runs": runs,
    }


def compare(old: Path, rounds: int) -> None:
    """This tree against `old`, alternately, on the same machine in the same minutes."""
    if (
        not (old / "commands" / "forgive.py").is_file()
        and not (old / "topologies" / "cli.py").is_file()
    ):
        raise SystemExit(f"--compare {old}: not a checkout of this project")
    # With a current compiled build, this tree also runs as plain Python in each round, so
    # that the build's share of the speed-up is measured side by side too.
    status = native.build_status()
    plain_too = status == "current"
    order = "old, new compiled, new plain" if plain_too else f"old then new (build: {status})"
    print(f"--compare {old}: {' '.join(COMPARE_RUN)}, {rounds} rounds, {order}")
    ratios, same, same_plain = [], True, True
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(rounds):
            pair = {}
            for tag, tree in (("old", old), ("new", ROOT)):
                pair[tag] = cli_run(tree, Path(tmp) / f"{tag}{n}")
            o, w = pair["old"], pair["new"]
            same = same and o["runs"] == w["runs"]
            rate_old = o["data_packets"] / o["wall_s"]
            rate_new = w["data_packets"] / w["wall_s"]
            ratios.append(rate_new / rate_old)
            print(
                f"  round {n + 1}: old {o['wall_s']:.1f} s wall, {o['cpu_s']:.1f} s CPU, "
                f"{rate_old:,.0f} DATA/s; new {w['wall_s']:.1f} s wall, {w['cpu_s']:.1f} s CPU, "
                f"{rate_new:,.0f} DATA/s; x{ratios[-1]:.2f} (CPU x{o['cpu_s'] / w['cpu_s']:.2f})"
            )
            if plain_too:
                p = cli_run(ROOT, Path(tmp) / f"plain{n}", pure=True)
                same_plain = same_plain and p["runs"] == w["runs"]
                print(
                    f"  round {n + 1}: new plain {p['wall_s']:.1f} s wall, {p['cpu_s']:.1f} s CPU; "
                    f"compiled against plain x{p['wall_s'] / w['wall_s']:.2f} "
                    f"(CPU x{p['cpu_s'] / w['cpu_s']:.2f})"
                )
    speedup = statistics.median(ratios)
    print(
        f"speed-up in DATA packets/s, median of {rounds}: x{speedup:.2f}; goal x{GOAL_SPEEDUP:g}: "
        f"{'met' if speedup >= GOAL_SPEEDUP else 'missed'}; runs.json "
        f"{'byte-identical' if same else 'DIFFERS'} between the two"
    )
    if plain_too:
        print(f"compiled and plain runs.json {'byte-identical' if same_plain else 'DIFFER'}")


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
        started, cpu = time.perf_counter(), time.process_time()
        run = plan_run(config, Path(out))
        result = collect_run(run, simulate_run(run, label=f"{ranks} ranks", engine_stats=stats))
        stats["total_s"] = time.perf_counter() - started
        stats["cpu_s"] = time.process_time() - cpu
    stats["data_packets"] = result.data_packets_sent
    return stats


def loop_cost_per_event(pending: int, events: int = 400_000) -> float:
    """Seconds the engine's clock takes per event (schedule, pop, one callback) with
    `pending` queued."""
    clock = Clock()
    left = [events]

    def again(value: object) -> None:
        if left[0]:
            left[0] -= 1
            clock.at(1e-6, again)

    for _ in range(pending):
        clock.at(1e-6, again)
    started = time.perf_counter()
    clock.run()
    return (time.perf_counter() - started) / (events + pending)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 20-step 64-rank run")
    parser.add_argument("--compare", type=Path, metavar="DIR", help="an older checkout to race")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs for --compare")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.compare is not None:
        compare(args.compare.resolve(), args.rounds)
        return
    core = best_rate(sender_run(100_000), 100_000, 3)
    print(f"protocol core, DATA out + ACK in: {core:,.0f} packets/s (the reference)")

    base = simulate(64, 2)
    frames_s = base["frames"] / base["wall_s"]
    events_s = base["events"] / base["wall_s"]
    per_event = loop_cost_per_event(pending=200)
    share = per_event * base["events"] / base["wall_s"]
    print(
        f"64 ranks, 2 steps: {base['wall_s']:.1f} s wall, {base['data_packets']:,} DATA packets, "
        f"{base['frames']:,} frames over links, {base['events']:,} events"
    )
    print(
        f"simulated frames/s {frames_s:,.0f} ({frames_s / core:.3f} of the core's rate), "
        f"DATA packets/s {base['data_packets'] / base['wall_s']:,.0f} "
        f"({base['data_packets'] / base['wall_s'] / core:.3f}), events/s {events_s:,.0f} "
        f"({events_s / core:.3f}); goal {GOAL_RATIO} for frames: "
        f"{'met' if frames_s / core >= GOAL_RATIO else 'missed'}"
    )
    print(f"event loop: {per_event * 1e6:.2f} us per event, {share:.1%} of the run")

    print("growth with ranks (3 steps, byte scale 64; CPU time of the whole run):")
    by_ranks = {}
    for ranks in (8, 16, 32, 64):
        by_ranks[ranks] = st = simulate(ranks, 3)
        st["per_data"] = st["cpu_s"] / st["data_packets"]
        print(
            f"  {ranks:3} ranks: {st['wall_s']:7.1f} s, {st['data_packets']:>9,} DATA packets, "
            f"x{st['wall_s'] / by_ranks[8]['wall_s']:.1f} of 8 ranks; "
            f"{st['per_data'] * 1e6:.0f} us CPU per DATA packet, "
            f"{st['cpu_s'] / st['frames'] * 1e6:.1f} us per frame over a link "
            f"({st['frames'] / st['data_packets']:.2f} frames per DATA packet), "
            f"{st['cpu_s'] / st['events'] * 1e6:.1f} us per event "
            f"({st['events'] / st['data_packets']:.2f} per DATA packet)"
        )
    big, small = by_ranks[64], by_ranks[8]
    flat = big["per_data"] / small["per_data"]
    per_frame = (big["cpu_s"] / big["frames"]) / (small["cpu_s"] / small["frames"])
    event_ratio = (big["cpu_s"] / big["events"]) / (small["cpu_s"] / small["events"])
    print(
        f"  per DATA packet, 64 ranks over 8: x{flat:.2f} (goal x{GOAL_FLAT}: "
        f"{'met' if flat <= GOAL_FLAT else 'missed'}); per frame over a link: x{per_frame:.2f}; "
        f"per event: x{event_ratio:.2f}"
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
