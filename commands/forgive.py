"""`forgive`: run training on a fabric of FORGIVE switches, emulated in Mininet or simulated.

    forgive run      one policy and seed; prints its table, writes a results folder
    forgive compare  several policies times several seeds on the same fabric and workload
    forgive impact   what a results folder's recorded loss does to a real model (commands.impact)
    forgive study    every result of the FORGIVE note, reproduced beside the note's (commands.study)
    forgive clean    remove what a killed run left behind (its veths and switch processes)

`--engine mininet` (the default) runs real processes on an emulated fabric and needs
root; `--engine sim` runs the same hosts and switch pipelines in virtual time and needs
neither. Every option is checked before anything starts; a bad one is one line on
stderr and exit status 2. Results (JSON, table, runs.csv, plots as PNG and PDF, every
host's records and logs) go to --out, by default results/<time>-<fabric>/.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from commands import impact as impact_cli
from commands import study as study_cli
from host_agent.core import CONTROLS, DEFAULT_CONTROL, DEFAULT_PROFILE, PROFILES
from host_agent.policies import DEFAULT_POLICY, POLICY_NAMES
from runplan.fabric import PRESETS, FabricError, FabricSpec
from runplan.run import (
    CAPTURE_FRAMES,
    CAPTURE_SNAPLEN,
    ENGINES,
    JOBS,
    Captures,
    RunConfig,
    RunError,
)
from runs.cache import RunCache, link_runs, run_cached
from runs.options import (
    TIMEOUT_HELP,
    add_regime_options,
    critical_from,
    dcqcn_profile,
    fabric_from,
    job_regime,
    with_regime,
)
from runs.progress import say
from runs.report import (
    COMPLETE,
    FolderError,
    clear_earlier_run,
    named,
    results_folder,
    writable_folder,
    write_results,
)
from runs.sweep import run_all, run_one
from topologies.leftovers import FabricBusy, clear_leftovers, fabric_lock
from topologies.runner import check as check_emulation
from topologies.runner import require_root
from workload.plan import MAX_STEPS

DEFAULT_POLICIES = ("tight", "forgive", "dcqcn", "shed")
POLICY_HELP = f"policies: {', '.join(POLICY_NAMES)} (docs/agent.md; default %(default)s)"
RUN_HELP = (
    "One policy and seed on one fabric: prints its table and writes a results folder. "
    "--engine sim needs no root and finishes a small fabric in seconds."
)
COMPARE_HELP = (
    "Several policies times several seeds on the same fabric and job: one table, a row per "
    "policy, each change in training time against tight of the same seed."
)
DEFAULT_SEEDS = (1, 2)
NUMBERS = (
    ("grad_mib", 0.0, False),
    ("tp_mib", 0.0, True),
    ("pp_mib", 0.0, True),
    ("compute_ms", 0.0, True),
    ("host_link_mbps", 0.0, False),
    ("byte_scale", 1.0, True),
    ("timeout", 0.0, False),
    ("jitter", 0.0, True),
)
"""Numeric options: attribute, bound, whether the bound itself is allowed."""


def _check_numbers(args: argparse.Namespace) -> None:
    """Refuse NaN, infinities and out-of-range numbers under the option's own name."""
    for name, bound, inclusive in NUMBERS:
        value = getattr(args, name)
        if value is None:
            continue
        if not (math.isfinite(value) and (value >= bound if inclusive else value > bound)):
            raise RunError(
                f"--{name.replace('_', '-')} must be a finite number "
                f"{'>=' if inclusive else '>'} {bound:g}, got {value}"
            )


def _fabric(args: argparse.Namespace, engine: str = "mininet") -> FabricSpec:
    return with_regime(fabric_from(args.fabric, engine, args.host_link_mbps, args.byte_scale), args)


def innermost(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The parser of the (sub)command `args` chose: the one whose usage an error should show."""
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            return parser if chosen is None else innermost(chosen, args)
    return parser


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s]
    except ValueError as err:
        raise RunError(f"bad --seeds: {err}") from None


def _common(parser: argparse.ArgumentParser) -> None:
    defaults = JOBS["default"]
    parser.add_argument(
        "--engine",
        default="mininet",
        help="mininet (default: real processes on an emulated fabric, root) or sim (virtual time)",
    )
    parser.add_argument(
        "--fabric",
        default="2to1",
        help=f"a preset ({', '.join(PRESETS)}) or a fabric file (.toml); default 2to1",
    )
    parser.add_argument("--switch", default="model", help="model (default) or bmv2")
    parser.add_argument(
        "--job",
        default="default",
        help=f"the training job's shape: {' or '.join(JOBS)}, the first when not given; the "
        "size options below override it",
    )
    parser.add_argument(
        "--steps", type=int, help=f"training steps, 1..{MAX_STEPS - 1} (default {defaults.steps})"
    )
    parser.add_argument(
        "--grad-mib",
        type=float,
        help="gradient MiB per rank per step at fabric scale (default 64)",
    )
    parser.add_argument("--tp-mib", type=float, help="to each tensor-parallel peer (16)")
    parser.add_argument("--tp-group", type=int, help="ranks per tensor-parallel group (2)")
    parser.add_argument("--pp-mib", type=float, help=f"default {defaults.pp_bytes / 2**20:g}")
    parser.add_argument(
        "--compute-ms", type=float, help=f"at fabric scale (default {defaults.compute_s * 1e3:g})"
    )
    parser.add_argument(
        "--detector", default=defaults.detector, help="static or accordion (default %(default)s)"
    )
    parser.add_argument(
        "--dcqcn",
        help=f"DCQCN profile of every host: {' or '.join(PROFILES)} (default {DEFAULT_PROFILE}; "
        "docs/dcqcn.md)",
    )
    parser.add_argument(
        "--cc",
        default=DEFAULT_CONTROL,
        help=f"congestion control of every sender: {' or '.join(CONTROLS)} (default {DEFAULT_CONTROL}; "
        "docs/nscc.md)",
    )
    parser.add_argument("--burst", action="store_true", help="background burst on step 2")
    parser.add_argument(
        "--placement",
        default="interleaved",
        help="ranks to hosts: interleaved (alternate leaves, default) or packed",
    )
    parser.add_argument(
        "--host-link-mbps",
        type=float,
        help="host link rate (emulation default 20; the simulator runs the fabric's own)",
    )
    parser.add_argument(
        "--byte-scale",
        type=float,
        help="divide every byte quantity by this (default 64)",
    )
    parser.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        metavar="FRAMES",
        help="--engine sim: each host frame reaches its switch port up to this many frame "
        "times late, seeded (default 0: exact timing; docs/simulation.md)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help=TIMEOUT_HELP)
    parser.add_argument(
        "--switch-restarts",
        type=int,
        default=0,
        metavar="N",
        help="start an exited switch again, up to N times per run, and carry on (default 0: "
        "a switch that exits ends the run)",
    )
    parser.add_argument("--out", type=Path, help="results folder (default results/<time>-<fabric>)")
    parser.add_argument(
        "--p4runtime-tls",
        metavar="DIR",
        help="P4Runtime over mutual TLS between the run's controller and switches, with the "
        "certificates in DIR (ca.pem, switch.pem/.key, controller.pem/.key; docs/switch_model.md)",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="replace the earlier run a results folder holds (refused otherwise)",
    )
    parser.add_argument(
        "--pcap",
        metavar="LINKS",
        help="write a pcapng per link into each run's folder: hosts (h1: its own link), links "
        "between switches (leaf1-spine1) or all, comma-separated (docs/emulation.md, Captures)",
    )
    parser.add_argument(
        "--pcap-snaplen",
        type=int,
        default=CAPTURE_SNAPLEN,
        metavar="BYTES",
        help=f"bytes kept of each captured frame (default {CAPTURE_SNAPLEN}: the headers and "
        "the payload's start)",
    )
    parser.add_argument(
        "--pcap-frames",
        type=int,
        default=CAPTURE_FRAMES,
        metavar="N",
        help=f"frames kept per capture; later ones are counted, not written (default {CAPTURE_FRAMES})",
    )
    add_regime_options(parser)


def _workload(args: argparse.Namespace):
    """The named job with every size given on the command line put in its place."""
    if args.job not in JOBS:
        raise RunError(f"--job must be one of {', '.join(JOBS)}, got {args.job!r}")
    given = {
        "steps": args.steps,
        "grad_bytes": None if args.grad_mib is None else round(args.grad_mib * 2**20),
        "tp_bytes": None if args.tp_mib is None else round(args.tp_mib * 2**20),
        "tp_group": args.tp_group,
        "pp_bytes": None if args.pp_mib is None else round(args.pp_mib * 2**20),
        "compute_s": None if args.compute_ms is None else args.compute_ms / 1e3,
        "critical": critical_from(args, args.steps or JOBS[args.job].steps) or None,
        **job_regime(args),
    }
    return replace(
        JOBS[args.job],
        detector=args.detector,
        burst=args.burst,
        **{k: v for k, v in given.items() if v is not None},
    )


def _configs(args: argparse.Namespace, policies, seeds) -> list[RunConfig]:
    if args.engine not in ENGINES:
        raise RunError(f"--engine must be one of {', '.join(ENGINES)}, got {args.engine!r}")
    if args.steps is not None and not 1 <= args.steps < MAX_STEPS:
        raise RunError(f"--steps must lie in 1..{MAX_STEPS - 1}, got {args.steps}")
    _check_numbers(args)
    workload = _workload(args)
    fabric = _fabric(args, args.engine)
    configs = [
        RunConfig(
            fabric,
            args.switch,
            policy,
            seed,
            workload,
            args.timeout,
            args.placement,
            engine=args.engine,
            dcqcn=dcqcn_profile(args),
            cc=args.cc,
            switch_restarts=args.switch_restarts,
            jitter_frames=args.jitter,
            captures=_captures(args),
            p4runtime_tls=args.p4runtime_tls,
        )
        for policy in policies
        for seed in seeds
    ]
    for config in configs:
        config.validate()
        if config.engine == "mininet":
            check_emulation(config)  # root, and BMv2 where asked for
    return configs


def _captures(args: argparse.Namespace) -> Captures:
    """What --pcap names and how much of it is kept; refused beside --cache, whose runs are
    taken as they were, never run again to be captured."""
    links = tuple(n.strip() for n in (args.pcap or "").split(",") if n.strip())
    if args.pcap is not None and not links:
        raise RunError("--pcap needs at least one host, link or all")
    if links and getattr(args, "cache", None) is not None:
        raise RunError("--pcap and --cache: a run the cache has is not run again to be captured")
    return Captures(links, args.pcap_snaplen, args.pcap_frames)


def _describe(config: RunConfig) -> str:
    fabric, sc = config.fabric, config.fabric.scaling
    return (
        f"fabric {fabric.name}: {fabric.leaves} leaves, {fabric.spines} spines, "
        f"{fabric.hosts_per_leaf} hosts per leaf, {fabric.oversubscription:g}:1; "
        f"host links {sc.host_link_bps / 1e6:g} Mbit/s for {fabric.host_link_gbps:g} Gbit/s, "
        f"bytes / {sc.byte_scale:g}, time x {sc.time_scale:g}; switch {config.switch}, "
        f"engine {config.engine}"
        + (
            f", host frames up to {config.jitter_frames:g} frame times late"
            if config.jitter_frames
            else ""
        )
    )


def _cut_short(out: Path, err: OSError, during_runs: bool) -> str:
    """The one line for a run that could not write its results folder (a full disk): the
    folder, the error, and what the folder holds after it. Result files are written whole
    (runs.atomic) and `COMPLETE` last, so none is ever part-written; a run's own records,
    written as it goes, are whole only for the runs that finished."""
    where = f" ({err.filename})" if err.filename else ""
    kept = (
        "the runs that finished are whole, a run under way is not"
        if during_runs
        else "the files written before are whole"
    )
    return (
        f"results folder {out}: {err.strerror or err}{where} "
        f"{'during the runs' if during_runs else 'writing the results'}; "
        f"cut short (no {COMPLETE}): {kept}"
    )


def clean() -> int:
    """As `mn -c` for Mininet: a run killed outright cannot tear its fabric down, and
    `forgive run` clears such leftovers itself; this does it on demand, never under a
    live run."""
    try:
        require_root()
        with fabric_lock(wait=False):
            removed = clear_leftovers()
    except (RunError, FabricBusy) as err:
        print(f"forgive: {err}", file=sys.stderr)
        return 1
    for line in removed:
        print(f"removed {line}")
    if not removed:
        print("nothing to remove")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="forgive", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="one policy and seed", description=RUN_HELP)
    _common(run_p)
    run_p.add_argument("--policy", default=DEFAULT_POLICY, help=POLICY_HELP)
    run_p.add_argument("--seed", type=int, default=1, help="the run's seed (default %(default)s)")
    cmp_p = sub.add_parser(
        "compare", help="policies x seeds, side by side", description=COMPARE_HELP
    )
    _common(cmp_p)
    cmp_p.add_argument(
        "--policies", default=",".join(DEFAULT_POLICIES), help=f"comma-separated; {POLICY_HELP}"
    )
    cmp_p.add_argument(
        "--seeds",
        default=",".join(map(str, DEFAULT_SEEDS)),
        help="comma-separated; each policy runs once per seed (default %(default)s)",
    )
    cmp_p.add_argument(
        "--cache",
        type=Path,
        metavar="DIR",
        help="keep runs in this run cache and reuse those it has (forgive study's is results/runs)",
    )
    cmp_p.add_argument("--fresh", action="store_true", help="with --cache: rerun cached runs too")
    cmp_p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="runs in parallel processes (--engine sim; default %(default)s)",
    )
    cmp_p.add_argument(
        "--dask", metavar="ADDRESS", help="run on this Dask scheduler (--engine sim)"
    )
    impact_cli.register(sub)
    study_cli.register(sub)
    sub.add_parser(
        "clean",
        help="remove what a killed run left behind",
        description="Remove the veths and switch processes a killed emulation left behind, as "
        "`mn -c` does for Mininet (root; never under a live run).",
    )
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's own parser, with its usage, not the top level's
        innermost(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "clean":
        return clean()
    if args.command == "impact":
        return impact_cli.main(args)
    if args.command == "study":
        return study_cli.main(args)
    try:
        if args.command == "run":
            policies, seeds = [args.policy], [args.seed]
        else:
            policies = [p for p in args.policies.split(",") if p]
            seeds = _seeds(args.seeds)
            if not policies or not seeds:
                raise RunError("--policies and --seeds need at least one entry each")
        configs = _configs(args, policies, seeds)
        workers, dask = getattr(args, "workers", 1), getattr(args, "dask", None)
        if workers < 1:
            raise RunError(f"--workers must be >= 1, got {workers}")
        if (workers > 1 or dask) and args.engine != "sim":
            raise RunError("--workers and --dask need --engine sim (emulations share one host)")
        out = results_folder(
            args.out
            or Path("results") / f"{time.strftime('%Y%m%d-%H%M%S')}-{configs[0].fabric.name}",
            "--out" if args.out else "results folder",
            args.replace,
        )
        if getattr(args, "cache", None) is not None:
            writable_folder(args.cache, "--cache")
    except (FabricError, RunError, FolderError) as err:
        print(f"forgive: {err}", file=sys.stderr)
        return 2
    removed = clear_earlier_run(out)
    if removed:
        print(
            f"forgive: --replace: removed the earlier run from {out} ({named(removed)})",
            file=sys.stderr,
        )
    print(_describe(configs[0]), file=sys.stderr)
    try:
        if getattr(args, "cache", None) is not None:
            cache = RunCache(args.cache)
            runs = run_cached(
                configs, cache, run_one, fresh=args.fresh, workers=workers, dask=dask, say=say
            )
            link_runs(out, configs, cache)
        else:
            runs = run_all(configs, out, workers=workers, dask=dask)
    except RunError as err:
        print(f"forgive: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("forgive: interrupted; network torn down", file=sys.stderr)
        return 130
    except OSError as err:  # a full disk, in the engine's records or a run's own files
        print(f"forgive: {_cut_short(out, err, during_runs=True)}", file=sys.stderr)
        return 1
    try:
        labelled = [(c.policy, c, r) for c, r in zip(configs, runs, strict=True)]
        table = write_results(out, runs, order=policies, labelled=labelled)
    except OSError as err:
        print(f"forgive: {_cut_short(out, err, during_runs=False)}", file=sys.stderr)
        return 1
    print(table)
    print(
        f"\nresults: {out} (runs.json, summary.json, table.txt, runs.csv, *.png, *.pdf)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
