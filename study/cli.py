"""`forgive study note`: every result of the FORGIVE note, reproduced and set beside the note's own.

Runs the note's policy variants on the worst fabric, forgive against tight on
the same fabric without oversubscription, and the two experiments the note
leaves open (a second job that obeys congestion control; a detector that errs),
then prints one table: per figure, the note's value and paragraph, this
study's range over seeds, and whether the direction and the magnitude (within
a factor of two) are reproduced. Runs are kept in a run cache (default
results/runs, shared with `forgive compare --cache`), so a study never repeats
a run it has, and an interrupted study resumes.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from host_agent.core import PROFILES
from study import report
from study.claims import CLAIMS, judge
from study.runs import Setup, by_variant, plan
from study.variants import BY_NAME, VARIANTS, Variant
from topologies.cache import RunCache, run_cached
from topologies.fabric import FabricError
from topologies.options import fabric_from
from topologies.runner import ENGINES, JOBS, RunConfig, RunError, say
from topologies.sweep import run_one

DEFAULT_SEEDS = (1, 2, 3)
DEFAULT_BASELINE_SEEDS = (1, 2, 3, 4, 5)
DEFAULT_CACHE = Path("results/runs")
ENGINE_DEFAULTS = {
    "sim": ("note-4to1", "note-1to1", "note"),
    "mininet": ("2to1", "nonblocking", "default"),
}
"""Per engine, the worst fabric, the one without oversubscription and the job it runs by
default: the simulator runs the note's own 64-rank fabrics and job, the emulation its
4-host presets."""
RUNNER = run_one
"""How one run is made (a test may put a stand-in here)."""


def register(sub: argparse._SubParsersAction) -> None:
    study = sub.add_parser("study", help="reproduce a document's results", description=__doc__)
    which = study.add_subparsers(dest="study", required=True)
    p = which.add_parser("note", help="the FORGIVE note's Results", description=__doc__)
    p.add_argument(
        "--engine",
        default="sim",
        help="sim (default: virtual time, the note's 64-rank fabrics) or mininet (root)",
    )
    p.add_argument(
        "--seeds", help=f"seeds of every variant (default {','.join(map(str, DEFAULT_SEEDS))})"
    )
    p.add_argument(
        "--baseline-seeds",
        help="seeds of tight and plain dcqcn, which the note runs on five "
        f"(default {','.join(map(str, DEFAULT_BASELINE_SEEDS))}, or --seeds when given)",
    )
    p.add_argument("--out", type=Path, help="output folder (default results/study-note-<time>)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="run cache (results/runs)")
    p.add_argument("--fresh", action="store_true", help="rerun the runs the cache has too")
    p.add_argument("--dcqcn", default="paper", help=f"DCQCN profile: {' or '.join(PROFILES)}")
    p.add_argument("--workers", type=int, default=1, help="runs in parallel processes (sim)")
    p.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run on this Dask scheduler's cluster (sim; the cache "
        "must be on a file system its workers share)",
    )
    p.add_argument("--job", help=f"the training job: {', '.join(JOBS)} (default: the engine's)")
    p.add_argument("--fabric", help="the worst fabric: a preset or a .toml file")
    p.add_argument("--nonblocking-fabric", help="the fabric without oversubscription")
    p.add_argument(
        "--variants",
        help=f"only these variants, comma-separated (default all: {', '.join(BY_NAME)})",
    )
    p.add_argument("--switch", default="model", help="model (default) or bmv2")
    p.add_argument("--steps", type=int, default=JOBS["default"].steps)
    p.add_argument(
        "--host-link-mbps",
        type=float,
        help="host link rate (emulation default 20; the simulator runs the fabric's own)",
    )
    p.add_argument(
        "--byte-scale", type=float, help="divide every byte quantity by this (default 64)"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="per run, s")


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise RunError(f"bad {option} {text!r}: integers, comma-separated") from None
    if not values:
        raise RunError(f"{option} needs at least one seed")
    return values


def setup_from(args: argparse.Namespace) -> tuple[Setup, list[Variant]]:
    """The study's setup and variants from its options; RunError or FabricError in one line."""
    if args.engine not in ENGINES:
        raise RunError(f"--engine must be one of {', '.join(ENGINES)}, got {args.engine!r}")
    worst_name, nonblocking_name, job = ENGINE_DEFAULTS[args.engine]
    job = args.job or job
    if job not in JOBS:
        raise RunError(f"--job must be one of {', '.join(JOBS)}, got {job!r}")
    if args.workers < 1:
        raise RunError(f"--workers must be >= 1, got {args.workers}")
    if (args.workers > 1 or args.dask) and args.engine != "sim":
        raise RunError("--workers and --dask need --engine sim (emulations share one host)")
    seeds = DEFAULT_SEEDS if args.seeds is None else _ints(args.seeds, "--seeds")
    if args.baseline_seeds is not None:
        baseline = _ints(args.baseline_seeds, "--baseline-seeds")
    else:
        baseline = DEFAULT_BASELINE_SEEDS if args.seeds is None else seeds
    names = BY_NAME if args.variants is None else [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise RunError(f"unknown variant {unknown[0]!r}" if unknown else "--variants is empty")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise RunError(f"--timeout must be a finite number > 0, got {args.timeout}")
    scaling = (args.engine, args.host_link_mbps, args.byte_scale)
    setup = Setup(
        worst=fabric_from(args.fabric or worst_name, *scaling),
        nonblocking=fabric_from(args.nonblocking_fabric or nonblocking_name, *scaling),
        workload=replace(JOBS[job], steps=args.steps),
        seeds=seeds,
        baseline_seeds=baseline,
        switch=args.switch,
        dcqcn=args.dcqcn,
        timeout_s=args.timeout,
        engine=args.engine,
    )
    return setup, [v for v in VARIANTS if v.name in names]


def _describe(
    setup: Setup, planned: list[tuple[Variant, RunConfig]], present: int, cache: RunCache
) -> str:
    worst, nb = setup.worst, setup.nonblocking
    return (
        f"study note: {len(planned)} runs ({present} in the cache {cache.root}); worst fabric "
        f"{worst.name} ({worst.oversubscription:g}:1), non-oversubscribed {nb.name} "
        f"({nb.oversubscription:g}:1); seeds {','.join(map(str, setup.seeds))}, baseline seeds "
        f"{','.join(map(str, setup.baseline_seeds))}; DCQCN {setup.dcqcn}; engine {setup.engine}"
    )


def main(args: argparse.Namespace) -> int:
    try:
        setup, variants = setup_from(args)
        planned = plan(setup, variants)
        for _, config in planned:
            config.validate()
    except (RunError, FabricError) as err:
        print(f"forgive study: {err}", file=sys.stderr)
        return 2
    cache = RunCache(args.cache)
    out = args.out or Path("results") / f"study-note-{time.strftime('%Y%m%d-%H%M%S')}"
    present = sum(1 for _, c in planned if cache.get(c) is not None)
    cached = 0 if args.fresh else present
    say(_describe(setup, planned, present, cache))
    started = time.monotonic()
    try:
        results = run_cached(
            [c for _, c in planned],
            cache,
            RUNNER,
            fresh=args.fresh,
            workers=args.workers,
            dask=args.dask,
            say=say,
        )
    except RunError as err:
        print(f"forgive study: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("forgive study: interrupted; finished runs are in the cache", file=sys.stderr)
        return 130
    wall = time.monotonic() - started
    runs = by_variant(planned, results)
    meta = {
        "engine": args.engine,
        "worst_fabric": setup.worst.name,
        "nonblocking_fabric": setup.nonblocking.name,
        "dcqcn": setup.dcqcn,
        "seeds": list(setup.seeds),
        "baseline_seeds": list(setup.baseline_seeds),
        "wall_time_s": wall,
        "runs_made": len(planned) - cached,
        "runs_from_cache": cached,
        "runs": {
            name: [str(cache.folder(c)) for v, c in planned if v.name == name] for name in runs
        },
    }
    table = report.write(out, judge(CLAIMS, runs), runs, meta)
    print(table)
    say(
        f"\nwall time {wall:.0f} s for {len(planned) - cached} runs ({cached} more from the "
        f"cache); results: {out} (table.txt, study.json, *.png)"
    )
    return 0
