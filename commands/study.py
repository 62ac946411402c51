"""`forgive study note`, `calibrate` and `regime`: the FORGIVE note's results, the calibration of
its baseline, and the regimes its saving depends on.

`note`: every result of the FORGIVE note, reproduced and set beside the note's own.

Runs the note's policy variants on the worst fabric, forgive against tight on
the same fabric without oversubscription, and the two experiments the note
leaves open (a second job that obeys congestion control; a detector that errs),
then prints one table: per figure, the note's value and paragraph, this
study's range over seeds, and whether the direction and the magnitude (within
a factor of two) are reproduced. Runs are kept in a run cache (default
results/runs, shared with `forgive compare --cache`), so a study never repeats
a run it has, and an interrupted study resumes.

`calibrate`: the note's calibration of its DCQCN baseline (study.calibrate): congestion
control off against DCQCN on, the rate cuts and their share from marks, and `tight`'s
non-critical all-reduce against its line-rate bound, in the same table form and cache.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from commands import study_astra
from host_agent.core import CONTROLS, DEFAULT_CONTROL, DEFAULT_PROFILE, PROFILES
from runplan.fabric import FabricError
from runplan.run import ENGINES, JOBS, RunConfig, RunError, Workload
from runs.cache import RunCache, run_cached
from runs.csvfile import write_runs_csv
from runs.options import (
    REGIME_PROFILES,
    TIMEOUT_HELP,
    add_regime_options,
    add_schedule_option,
    critical_from,
    dcqcn_profile,
    fabric_from,
    job_regime,
    with_regime,
)
from runs.progress import say
from runs.report import FolderError, writable_folder
from runs.results import RunResult
from runs.sweep import run_one
from study import calibrate, page, regime, report
from study.claims import CLAIMS, NSCC_CLAIMS, judge
from study.runs import Setup, by_variant, plan
from study.variants import BY_NAME, NSCC_VARIANTS, VARIANTS, Variant, critical_steps

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
    p = which.add_parser(
        "note", help="the FORGIVE note's Results", description=__doc__.split("\n\n`calibrate`")[0]
    )
    _shared_options(p, "note")
    p.add_argument(
        "--baseline-seeds",
        help="seeds of tight and plain dcqcn, which the note runs on five "
        f"(default {','.join(map(str, DEFAULT_BASELINE_SEEDS))}, or --seeds when given)",
    )
    p.add_argument("--nonblocking-fabric", help="the fabric without oversubscription")
    p.add_argument(
        "--cc",
        default=DEFAULT_CONTROL,
        help=f"{' or '.join(CONTROLS)}; nscc adds the headline variants under NSCC "
        f"({', '.join(v.name for v in NSCC_VARIANTS)}) and their rows (docs/nscc.md)",
    )
    p.add_argument(
        "--variants",
        help=f"only these variants, comma-separated (default all: {', '.join(BY_NAME)})",
    )
    c = which.add_parser(
        "calibrate",
        help="the note's calibration of its DCQCN baseline",
        description=calibrate.__doc__,
    )
    _shared_options(c, "calibrate")
    c.add_argument(
        "--variants",
        help="only these variants, comma-separated (default all: "
        f"{', '.join(v.name for v in calibrate.VARIANTS)})",
    )
    _register_regime(which)
    study_astra.register(which)


def _shared_options(p: argparse.ArgumentParser, name: str) -> None:
    """The options `study note` and `study calibrate` share."""
    p.add_argument(
        "--engine",
        default="sim",
        help="sim (default: virtual time, the note's 64-rank fabrics) or mininet (root)",
    )
    p.add_argument(
        "--seeds", help=f"seeds of every variant (default {','.join(map(str, DEFAULT_SEEDS))})"
    )
    _run_options(p, name)
    p.add_argument(
        "--dcqcn", help=f"DCQCN profile: {' or '.join(PROFILES)} (default paper, or --profile's)"
    )
    p.add_argument("--job", help=f"the training job: {', '.join(JOBS)} (default: the engine's)")
    p.add_argument(
        "--fabric",
        help="the worst fabric: a preset or a .toml file (default: note-4to1 under sim, "
        "2to1 under mininet)",
    )
    p.add_argument("--switch", default="model", help="model (default) or bmv2")
    p.add_argument("--steps", type=int, default=JOBS["default"].steps, help="default %(default)s")
    p.add_argument(
        "--host-link-mbps",
        type=float,
        help="host link rate (emulation default 20; the simulator runs the fabric's own)",
    )
    p.add_argument(
        "--byte-scale", type=float, help="divide every byte quantity by this (default 64)"
    )
    add_regime_options(p)


def _run_options(p: argparse.ArgumentParser, name: str) -> None:
    """Where a study's runs go and how they are made: every study command takes these."""
    p.add_argument("--out", type=Path, help=f"output folder (default results/study-{name}-<time>)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="run cache (results/runs)")
    p.add_argument("--fresh", action="store_true", help="rerun the runs the cache has too")
    p.add_argument(
        "--workers", type=int, default=1, help="runs in parallel processes (sim; default 1)"
    )
    p.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run on this Dask scheduler's cluster (sim; the cache "
        "must be on a file system its workers share)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help=TIMEOUT_HELP)


REGIME_BYTE_SCALE = 32.0
"""The regime grid's default byte scale: 32 is the coarsest at which a ring chunk of the note's
job is more than a few packets and a 4 MiB queue holds 32 full frames (docs/study.md)."""
REGIME_STEPS, REGIME_CRITICAL = 5, "1"
"""The regime grid's default run: five steps, the first critical, the note's share of critical
steps (4 of 20) in a quarter of the CPU; docs/study.md ("Five steps, one critical") says where
that stands for twenty steps and where it does not."""


def _register_regime(which: argparse._SubParsersAction) -> None:
    from study.regime import AXES, DEFAULT_GRID

    p = which.add_parser(
        "regime",
        help="forgive's saving against the baseline's slack, over a grid of regimes",
        description=regime.__doc__,
    )
    p.add_argument(
        "--cells",
        help="only these cells, comma-separated: base or AXIS=VALUE, AXIS one of "
        f"{', '.join(AXES)} (default: {', '.join(c.name for c in DEFAULT_GRID)})",
    )
    p.add_argument("--seeds", help="seeds of every cell (default 1,2,3)")
    p.add_argument("--fabric", default="note-4to1", help="the base point's fabric (note-4to1)")
    p.add_argument("--job", default="note", help=f"the training job: {', '.join(JOBS)} (note)")
    p.add_argument("--steps", type=int, default=REGIME_STEPS, help=f"default {REGIME_STEPS}")
    p.add_argument(
        "--byte-scale",
        type=float,
        default=REGIME_BYTE_SCALE,
        help=f"divide every byte quantity by this (default {REGIME_BYTE_SCALE:g})",
    )
    p.add_argument(
        "--dcqcn",
        help=f"the base point's DCQCN profile: {', '.join(PROFILES)} (default "
        f"{DEFAULT_PROFILE}, or --profile's)",
    )
    p.add_argument(
        "--profile",
        help=f"the base point under a named set of regime options: {', '.join(REGIME_PROFILES)} "
        "(default none); cells without=MECHANISM then take one of its mechanisms away",
    )
    add_schedule_option(p, REGIME_CRITICAL)
    _run_options(p, "regime")


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
    calibrating = args.study == "calibrate"
    if not calibrating and args.baseline_seeds is not None:
        baseline = _ints(args.baseline_seeds, "--baseline-seeds")
    else:
        baseline = DEFAULT_BASELINE_SEEDS if args.seeds is None and not calibrating else seeds
    cc = getattr(args, "cc", DEFAULT_CONTROL)  # `study note` alone has --cc
    if cc not in CONTROLS:
        raise RunError(f"--cc must be one of {', '.join(CONTROLS)}, got {cc!r}")
    variants = calibrate.VARIANTS if calibrating else VARIANTS + NSCC_VARIANTS
    names = [x.name for x in variants if x.cc == DEFAULT_CONTROL]
    if args.variants is not None:
        names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in {x.name for x in variants}]
    if unknown or not names:
        raise RunError(
            f"--variants: unknown variant {unknown[0]!r} (known: "
            f"{', '.join(x.name for x in variants)})"
            if unknown
            else "--variants is empty"
        )
    if cc == "nscc":
        names += [v.name for v in NSCC_VARIANTS if v.name not in names]
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise RunError(f"--timeout must be a finite number > 0, got {args.timeout}")
    scaling = (args.engine, args.host_link_mbps, args.byte_scale)
    worst = with_regime(fabric_from(args.fabric or worst_name, *scaling), args)
    setup = Setup(
        worst=worst,
        nonblocking=worst
        if calibrating
        else fabric_from(args.nonblocking_fabric or nonblocking_name, *scaling),
        workload=replace(
            JOBS[job],
            steps=args.steps,
            critical=critical_from(args, args.steps),
            **job_regime(args),
        ),
        seeds=seeds,
        baseline_seeds=baseline,
        switch=args.switch,
        dcqcn=dcqcn_profile(args),
        timeout_s=args.timeout,
        engine=args.engine,
    )
    return setup, [v for v in variants if v.name in names]


def _describe(
    name: str,
    setup: Setup,
    planned: list[tuple[Variant, RunConfig]],
    present: int,
    cache: RunCache,
) -> str:
    worst, nb = setup.worst, setup.nonblocking
    fabrics = f"worst fabric {worst.name} ({worst.oversubscription:g}:1)"
    seeds = f"seeds {','.join(map(str, setup.seeds))}"
    if name == "note":
        fabrics += f", non-oversubscribed {nb.name} ({nb.oversubscription:g}:1)"
        seeds += f", baseline seeds {','.join(map(str, setup.baseline_seeds))}"
    else:
        fabrics += f" at bytes / {worst.scaling.byte_scale:g}"
    fabrics += f", {_schedule(setup.workload)}"
    return (
        f"study {name}: {len(planned)} runs ({present} in the cache {cache.root}); {fabrics}; "
        f"{seeds}; DCQCN {setup.dcqcn}; engine {setup.engine}"
    )


def _schedule(workload: Workload) -> str:
    """'20 steps (critical 1,2,3,20)': the run length and the static schedule's verdicts."""
    critical = sorted(critical_steps(workload.steps, workload.critical))
    return f"{workload.steps} steps (critical {','.join(map(str, critical))})"


def _regime_setup(args: argparse.Namespace):
    """The base configuration, the cells and the seeds; RunError or FabricError in one line."""
    if args.job not in JOBS:
        raise RunError(f"--job must be one of {', '.join(JOBS)}, got {args.job!r}")
    if args.workers < 1:
        raise RunError(f"--workers must be >= 1, got {args.workers}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise RunError(f"--timeout must be a finite number > 0, got {args.timeout}")
    if args.dcqcn is not None and args.dcqcn not in PROFILES:
        raise RunError(f"--dcqcn must be one of {', '.join(PROFILES)}, got {args.dcqcn!r}")
    if args.profile is not None and args.profile not in REGIME_PROFILES:
        raise RunError(
            f"--profile must be one of {', '.join(REGIME_PROFILES)}, got {args.profile!r}"
        )
    cells = regime.DEFAULT_GRID if args.cells is None else regime.parse_cells(args.cells)
    seeds = DEFAULT_SEEDS if args.seeds is None else _ints(args.seeds, "--seeds")
    base = RunConfig(
        fabric_from(args.fabric, "sim", None, args.byte_scale),
        workload=replace(
            JOBS[args.job], steps=args.steps, critical=critical_from(args, args.steps)
        ),
        timeout_s=args.timeout,
        engine="sim",
    )
    if args.profile is not None:
        base = regime.with_profile(base, args.profile)
    if args.dcqcn is not None:
        base = replace(base, dcqcn=args.dcqcn)
    left_out: list[str] = []
    if args.cells is None:
        cells, left_out = regime.feasible(cells, base)
    planned = regime.plan(cells, base, seeds)
    for _, config in planned:
        config.validate()
    return base, cells, seeds, planned, left_out


def _folders(args: argparse.Namespace, name: str) -> tuple[RunCache, Path]:
    """The run cache and the results folder, each made and written to before the first run
    (FolderError in one line): a study must not run for hours and then find it cannot keep
    what it measured."""
    out = writable_folder(
        args.out or Path("results") / f"study-{name}-{time.strftime('%Y%m%d-%H%M%S')}",
        "--out" if args.out else "results folder",
    )
    return RunCache(writable_folder(args.cache, "--cache")), out


def _run_planned(
    planned: Sequence[tuple[Any, RunConfig]], cache: RunCache, args: argparse.Namespace
) -> tuple[list[RunResult], float] | int:
    """Every planned run through the cache: (results, wall time), or the exit status of a
    study that failed (1) or was interrupted (130), its one line printed."""
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
    return results, time.monotonic() - started


def main_regime(args: argparse.Namespace) -> int:
    try:
        base, cells, seeds, planned, left_out = _regime_setup(args)
        cache, out = _folders(args, "regime")
    except (RunError, FabricError, FolderError) as err:
        print(f"forgive study: {err}", file=sys.stderr)
        return 2
    for reason in left_out:
        say(f"study regime: left out {reason}")
    present = sum(1 for _, c in planned if cache.get(c) is not None)
    cached = 0 if args.fresh else present
    say(
        f"study regime: {len(cells)} cells x {len(regime.POLICIES)} policies x {len(seeds)} "
        f"seeds = {len(planned)} runs ({present} in the cache {cache.root}); base "
        f"{base.fabric.name}, bytes / {base.fabric.scaling.byte_scale:g}, DCQCN {base.dcqcn}, "
        f"{_schedule(base.workload)}"
    )
    ran = _run_planned(planned, cache, args)
    if isinstance(ran, int):
        return ran
    results, wall = ran
    made = len(planned) - cached
    cells_figures = regime.figures(planned, results)
    fitted = regime.fit(cells_figures)
    meta = {
        "study": "regime",
        "base_fabric": base.fabric.name,
        "byte_scale": base.fabric.scaling.byte_scale,
        "dcqcn": base.dcqcn,
        "steps": base.workload.steps,
        "critical_steps": sorted(critical_steps(base.workload.steps, base.workload.critical)),
        "seeds": list(seeds),
        "cells_left_out": left_out,
        "wall_time_s": wall,
        "runs_made": made,
        "runs_from_cache": cached,
        "wall_time_per_run_made_s": wall / made if made else None,
    }
    table = regime.format_table(cells_figures)
    if fitted is not None:
        slope, intercept, rms = fitted
        table += (
            f"\n\nsaving = {slope:.2f} x slack {intercept:+.2f} points over {len(cells)} cells "
            f"(RMS residual {rms:.2f}); the note: slack {regime.NOTE_SLACK:.2f}, saving "
            f"{regime.NOTE_SAVING[0]:g} to {regime.NOTE_SAVING[1]:g} %"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.txt").write_text(table + "\n")
    (out / "regime.json").write_text(json.dumps(regime.to_json(cells_figures, meta), indent=1))
    from study.plots import plot_regime

    images = plot_regime(out, cells_figures, fitted)
    rows = [
        (c.cell.name, regime.median(c.change_pct), cells)
        for c, cells in zip(cells_figures, regime.table_rows(cells_figures), strict=True)
    ]
    notes = [table.rpartition("\n\n")[2]] if fitted is not None else []
    page.write_page(
        out,
        page.Page(
            "forgive study regime", regime.HEADER, rows, regime.MEANINGS, meta, images,
            notes=notes,
        ),
    )  # fmt: skip
    write_runs_csv(
        out,
        [
            (f"{cell.name}/{config.policy}", config, result)
            for (cell, config), result in zip(planned, results, strict=True)
        ],
    )
    print(table)
    say(
        f"\nwall time {wall:.0f} s for {made} runs ({cached} more from the cache); results: "
        f"{out} (table.txt, regime.json, report.html, runs.csv, *.png, *.pdf)"
    )
    return 0


def main(args: argparse.Namespace) -> int:
    if args.study == "regime":
        return main_regime(args)
    if args.study == "astra":
        return study_astra.main(args)
    try:
        setup, variants = setup_from(args)
        planned = plan(setup, variants)
        for _, config in planned:
            config.validate()
        name = args.study
        cache, out = _folders(args, name)
    except (RunError, FabricError, FolderError) as err:
        print(f"forgive study: {err}", file=sys.stderr)
        return 2
    present = sum(1 for _, c in planned if cache.get(c) is not None)
    cached = 0 if args.fresh else present
    say(_describe(name, setup, planned, present, cache))
    ran = _run_planned(planned, cache, args)
    if isinstance(ran, int):
        return ran
    results, wall = ran
    runs = by_variant(planned, results)
    labelled = [(v.name, c, r) for (v, c), r in zip(planned, results, strict=True)]
    meta = {
        "engine": args.engine,
        "worst_fabric": setup.worst.name,
        **({} if name == "calibrate" else {"nonblocking_fabric": setup.nonblocking.name}),
        "byte_scale": setup.worst.scaling.byte_scale,
        "steps": setup.workload.steps,
        "critical_steps": sorted(critical_steps(setup.workload.steps, setup.workload.critical)),
        "profile": getattr(args, "profile", None),
        "nic": asdict(setup.worst.nic),
        "tp_phase": setup.workload.tp_phase,
        **{
            key: getattr(setup.workload, key)
            for key in ("splits", "active_splits", "completion", "reduce_bytes_per_s")
            if getattr(setup.workload, key) != getattr(Workload, key)
        },
        "data_queue_bytes": setup.worst.switch.data_queue_bytes,
        "dcqcn": setup.dcqcn,
        **({"cc": sorted({v.cc for v in variants})} if name == "note" else {}),
        "seeds": list(setup.seeds),
        "baseline_seeds": list(setup.baseline_seeds),
        "wall_time_s": wall,
        "runs_made": len(planned) - cached,
        "runs_from_cache": cached,
        "runs": {
            name: [str(cache.folder(c)) for v, c in planned if v.name == name] for name in runs
        },
    }
    try:
        if name == "calibrate":
            tight = setup.config(calibrate.BY_NAME[calibrate.TIGHT], setup.seeds[0])
            verdicts = judge(calibrate.claims(tight), runs)
            held, lines = calibrate.rows_held(verdicts)
            meta["calibration_rows_held"] = held
            table = report.write(
                out, verdicts, runs, meta, labelled, title="forgive study calibrate"
            )
            table += f"\n\ncalibration rows held (direction and x2): {held} of 4\n"
            table += "\n".join(lines)
            (out / "table.txt").write_text(table + "\n")
        else:
            nscc = any(v.cc == "nscc" for v in variants)
            claims = CLAIMS + NSCC_CLAIMS if nscc else CLAIMS
            table = report.write(out, judge(claims, runs), runs, meta, labelled)
    except OSError as err:
        print(f"forgive study: writing to {out}: {err.strerror or err}", file=sys.stderr)
        return 1
    print(table)
    say(
        f"\nwall time {wall:.0f} s for {len(planned) - cached} runs ({cached} more from the "
        f"cache); results: {out} (table.txt, study.json, report.html, runs.csv, *.png, *.pdf)"
    )
    return 0
