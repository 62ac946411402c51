"""`forgive study astra`: this project's DCQCN baseline beside ASTRA-sim's ns-3 backend, on one
run description.

Writes ASTRA-sim's inputs from the run (study.astra: topology, network config, system and
logical topology JSON, Chakra traces), runs ASTRA-sim with DCQCN on and off, runs this
project's simulator on the same job and fabric under each named profile (default: today's
defaults, `astra` and `astra-ns3`), and prints one table at fabric scale: the all-reduce's
median over the non-critical steps and its ratio to the line-rate bound, the step, rate cuts,
CNPs, marks, and what each fabric does with a full queue (trims here; PFC pauses and drops
there). `--write-inputs DIR` writes the inputs and the commands that run them, and stops.

ASTRA-sim is in no registry: docs/astra-sim.md builds it (with the two patches the counters
and a run's end need) and installs Chakra into a Python of its own (`--chakra-python`).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import records
from host_agent.core import PROFILES
from runplan.fabric import FabricError
from runplan.run import JOBS, RunConfig, RunError
from runs.cache import RunCache, run_cached
from runs.collect import read_jsonl
from runs.options import (
    REGIME_PROFILES,
    add_regime_options,
    critical_from,
    fabric_from,
    job_regime,
    with_regime,
)
from runs.progress import say
from runs.report import FolderError, writable_folder
from runs.results import RunResult, render_table
from runs.sweep import run_one
from study import astra
from study.slack import allreduce_bound_s

DEFAULT_PROFILES = ("default", "astra", "astra-ns3")
"""This project's runs beside ASTRA-sim's: today's defaults, ASTRA-sim's transport settings
(`astra`), and its mechanisms too (`astra-ns3`)."""
ASTRA_SIDE = "astra-ns3"
"""The profile whose settings ASTRA-sim's inputs take (payload, window, the all-reduce's
parts) unless an option gives them: ASTRA-sim as it ships."""
CCS = ("dcqcn", "off")
ASTRA_SIM_ENV = "FORGIVE_ASTRA_SIM"
CHAKRA_PYTHON_ENV = "FORGIVE_CHAKRA_PYTHON"
"""Where docs/astra-sim.md's build put the binary and Chakra's Python, for every command and
test that runs them."""


def register(which: argparse._SubParsersAction) -> None:
    p = which.add_parser(
        "astra",
        help="the DCQCN baseline beside ASTRA-sim's ns-3 backend, on one run description",
        description=__doc__,
    )
    p.add_argument("--fabric", default="note-4to1", help="a preset or a .toml file (note-4to1)")
    p.add_argument("--job", default="note", help=f"the training job: {', '.join(JOBS)} (note)")
    p.add_argument(
        "--steps",
        type=int,
        default=2,
        help="training steps (default 2: the first critical, the second read)",
    )
    p.add_argument(
        "--byte-scale",
        type=float,
        default=32.0,
        help="divide every byte quantity by this; it must divide 32 (default 32)",
    )
    p.add_argument(
        "--tp-mib",
        type=float,
        default=0.0,
        help="tensor-parallel MiB to each group peer at fabric scale (default 0: the "
        "all-reduce alone; the note job's is 54)",
    )
    p.add_argument("--seed", type=int, default=1, help="this project's runs' seed (default 1)")
    p.add_argument(
        "--ours",
        default=",".join(DEFAULT_PROFILES),
        help="profiles this project's simulator runs under, comma-separated: default (no "
        f"profile) or one of {', '.join(REGIME_PROFILES)} (default {','.join(DEFAULT_PROFILES)})",
    )
    p.add_argument(
        "--cc",
        default=",".join(CCS),
        help="congestion control of both sides: dcqcn (ASTRA-sim's CC_MODE 1, the nic "
        "profile here) and/or off (default dcqcn,off)",
    )
    p.add_argument(
        "--astra-sim",
        metavar="BIN",
        default=os.environ.get(ASTRA_SIM_ENV),
        help=f"the ASTRA-sim ns-3 binary to run (default ${ASTRA_SIM_ENV})",
    )
    p.add_argument(
        "--chakra-python",
        metavar="PYTHON",
        default=os.environ.get(CHAKRA_PYTHON_ENV),
        help=f"a Python with Chakra installed, which writes the traces (default "
        f"${CHAKRA_PYTHON_ENV}, else this one)",
    )
    p.add_argument(
        "--write-inputs", type=Path, metavar="DIR", help="write ASTRA-sim's inputs and stop"
    )
    p.add_argument("--out", type=Path, help="output folder (default results/study-astra-<time>)")
    p.add_argument("--cache", type=Path, default=Path("results/runs"), help="run cache")
    p.add_argument("--fresh", action="store_true", help="rerun what the cache has")
    p.add_argument("--workers", type=int, default=1, help="this project's runs in parallel")
    p.add_argument("--timeout", type=float, default=7200.0, help="per run, s (default 7200)")
    p.add_argument(
        "--dcqcn",
        help=f"this project's DCQCN profile with --cc dcqcn: {' or '.join(PROFILES)} (default "
        "the profile's, else nic: ASTRA-sim's)",
    )
    add_regime_options(p)
    p.set_defaults(critical_steps="1")


def _profiles(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n != "default" and n not in REGIME_PROFILES]
    if unknown or not names:
        raise RunError(
            f"--ours: unknown profile {unknown[0]!r}" if unknown else "--ours names none"
        )
    return names


def _ccs(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    if not names or any(n not in CCS for n in names):
        raise RunError(f"--cc must name some of {', '.join(CCS)}, got {text!r}")
    return names


def _config(args: argparse.Namespace, profile: str | None, cc: str) -> RunConfig:
    """The run of `profile` (None: no profile) with congestion control `cc`, every option
    given on the command line over the profile's."""
    if args.job not in JOBS:
        raise RunError(f"--job must be one of {', '.join(JOBS)}, got {args.job!r}")
    given = argparse.Namespace(**{**vars(args), "profile": profile})
    spec = with_regime(fabric_from(args.fabric, "sim", None, args.byte_scale), given)
    workload = replace(
        JOBS[args.job],
        steps=args.steps,
        tp_bytes=round(args.tp_mib * 2**20),
        pp_bytes=0,
        critical=critical_from(args, args.steps),
        **job_regime(given),
    )
    dcqcn = (
        "off"
        if cc == "off"
        else args.dcqcn or str(REGIME_PROFILES.get(profile or "", {}).get("dcqcn", "nic"))
    )
    if dcqcn not in PROFILES:
        raise RunError(f"--dcqcn must be one of {', '.join(PROFILES)}, got {dcqcn!r}")
    config = RunConfig(
        spec, policy="dcqcn", seed=args.seed, workload=workload, engine="sim", dcqcn=dcqcn,
        timeout_s=args.timeout,
    )  # fmt: skip
    config.validate()
    return config


def _noncritical(config: RunConfig) -> list[int]:
    """The steps the comparison reads: the non-critical ones (every step if none is)."""
    from host_agent.core import StaticSchedule

    schedule = StaticSchedule.of(config.workload.steps, config.workload.critical)
    steps = [s for s in range(1, config.workload.steps + 1) if not schedule.classify(s, None)]
    return steps or list(range(1, config.workload.steps + 1))


def _astra_key(inputs: astra.Inputs, cc: str, binary: str) -> str:
    """What decides an ASTRA-sim run's figures: its inputs' bytes, its config, the binary and
    how its outputs are read (study.astra.READ_VERSION). Where the inputs were written is not
    part of it: the config names its files by their paths, so the folder is taken out, and the
    same run written under another --out is the same run."""
    digest = hashlib.sha256(f"read {astra.READ_VERSION}".encode())
    here = str(inputs.folder).encode()

    def content(path: Path) -> bytes:
        return path.read_bytes().replace(here, b"$INPUTS")

    for path in sorted(inputs.folder.rglob("*")):
        if path.is_file() and not path.relative_to(inputs.folder).parts[0].startswith("out-"):
            digest.update(str(path.relative_to(inputs.folder)).encode() + content(path))
    digest.update(content(inputs.output(cc) / "config.txt"))
    stat = Path(binary).stat()
    digest.update(f"{Path(binary).resolve()} {stat.st_size} {stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _row(
    simulator: str, profile: str, cc: str, config: RunConfig, figures: dict[str, Any]
) -> dict[str, Any]:
    bound = allreduce_bound_s(config)
    ar = figures["allreduce_ms"]
    return {
        "simulator": simulator,
        "profile": profile,
        "cc": cc,
        "allreduce_ms": ar,
        "allreduce_over_bound": None if ar is None else ar / 1e3 / bound,
        "step_ms": figures["step_ms"],
        "rate_cuts": figures["rate_cuts"],
        "cnps": figures["cnps"],
        "ce_marks": figures["ce_marks"],
        "full_queue": figures["full_queue"],
        "below_line_ms": figures["below_line_ms"],
        "wall_s": figures["wall_s"],
    }


def below_line_s(folder: Path) -> float:
    """The time every flow of a run spent below the line rate, summed (s, the run's clock),
    from its agents' flow records."""
    total = 0.0
    for path in sorted(folder.glob("*.agent.jsonl")):
        for record in read_jsonl(path):
            if record.get(records.TYPE) == records.FLOW_SEND:
                total += record.get("below_line_s", 0.0)
    return total


def _ours(result: RunResult, steps: list[int], folder: Path) -> dict[str, Any]:
    """This project's figures; no wall time: a run may come from the cache, and its runs
    share the workers, so no figure of the batch is one run's."""
    scale = 1 / result.time_scale
    chosen = [v for s in result.steps if s.step in steps for v in s.allreduce_s]
    return {
        "allreduce_ms": statistics.median(chosen) * scale * 1e3 if chosen else None,
        "step_ms": result.training_time_s * scale * 1e3 / len(result.steps),
        "rate_cuts": result.rate_cuts,
        "cnps": result.cnps,
        "ce_marks": result.ce_marks,
        "full_queue": f"{result.trims:,} trims, "
        f"{result.trim_drops + result.accounting.get('drops_at_switches', 0):,} drops",
        "below_line_ms": below_line_s(folder) * scale * 1e3,
        "wall_s": None,
    }


def _theirs(run: astra.AstraRun, steps: list[int], total_steps: int) -> dict[str, Any]:
    c = run.counters
    return {
        "allreduce_ms": astra.median_ms(run.allreduce_s, steps),
        "step_ms": max(run.finished_s) * 1e3 / total_steps,
        "rate_cuts": c.get("dcqcn_rate_cuts"),
        "cnps": c.get("cnp_recv"),
        "ce_marks": c.get("ecn_marks_data"),
        "full_queue": f"{c.get('pfc_pause_sent', 0)} pauses, {c.get('drops', 0)} drops",
        "below_line_ms": c.get("qp_below_line_rate_ns", 0) * 1e-6,
        "wall_s": run.wall_s,
    }


def _unfinished(doc: dict[str, Any]) -> dict[str, Any]:
    """An ASTRA-sim run that stopped with ranks unfinished: what it counted, no times."""
    c = doc["counters"]
    return {
        "allreduce_ms": None,
        "step_ms": None,
        "rate_cuts": c.get("dcqcn_rate_cuts"),
        "cnps": c.get("cnp_recv"),
        "ce_marks": c.get("ecn_marks_data"),
        "full_queue": f"{c.get('pfc_pause_sent', 0)} pauses, {c.get('drops', 0)} drops; "
        f"unfinished, idle from {doc['stopped_s'] * 1e3:.1f} ms",
        "below_line_ms": c.get("qp_below_line_rate_ns", 0) * 1e-6,
        "wall_s": None,
    }


COLUMNS = (
    ("simulator", "simulator", "{}"),
    ("profile", "profile", "{}"),
    ("cc", "cc", "{}"),
    ("AR non-crit ms", "allreduce_ms", "{:.2f}"),
    ("AR / bound", "allreduce_over_bound", "{:.2f}"),
    ("step ms", "step_ms", "{:.2f}"),
    ("rate cuts", "rate_cuts", "{:,}"),
    ("CNPs", "cnps", "{:,}"),
    ("marks", "ce_marks", "{:,}"),
    ("full queue", "full_queue", "{}"),
    ("QP-ms below line", "below_line_ms", "{:,.1f}"),
    ("ASTRA-sim wall s", "wall_s", "{:.0f}"),
)


def table(rows: list[dict[str, Any]]) -> str:
    cells = [[head for head, _, _ in COLUMNS]]
    for row in rows:
        cells.append(["-" if row[key] is None else fmt.format(row[key]) for _, key, fmt in COLUMNS])
    return render_table(cells)


def main(args: argparse.Namespace) -> int:
    try:
        if args.profile is not None:
            raise RunError("--profile: study astra names this project's profiles with --ours")
        profiles = _profiles(args.ours)
        ccs = _ccs(args.cc)
        if args.workers < 1:
            raise RunError(f"--workers must be >= 1, got {args.workers}")
        theirs = {cc: _config(args, ASTRA_SIDE, cc) for cc in ccs}
        ours = {
            (p, cc): _config(args, None if p == "default" else p, cc)
            for p in profiles
            for cc in ccs
        }
        if args.write_inputs is not None:
            folder = writable_folder(args.write_inputs, "--write-inputs")
            inputs = astra.write_inputs(theirs[ccs[0]], folder, args.chakra_python)
            binary = args.astra_sim or "ASTRA_SIM_BINARY"
            for cc in ccs:
                print(
                    f"cd {inputs.output(cc)} && {shlex.quote(binary)} "
                    + " ".join(shlex.quote(a) for a in inputs.arguments(cc))
                )
            say(f"study astra: ASTRA-sim's inputs in {folder}")
            return 0
        if args.astra_sim is None:
            raise RunError(
                f"--astra-sim BIN (or ${ASTRA_SIM_ENV}) is needed to run ASTRA-sim "
                "(docs/astra-sim.md builds it)"
            )
        if not Path(args.astra_sim).is_file():
            raise RunError(f"--astra-sim {args.astra_sim}: no such file")
        out = writable_folder(
            args.out or Path("results") / f"study-astra-{time.strftime('%Y%m%d-%H%M%S')}",
            "--out" if args.out else "results folder",
        )
        cache = RunCache(writable_folder(args.cache, "--cache"))
    except (RunError, FabricError, FolderError, astra.AstraError) as err:
        print(f"forgive study astra: {err}", file=sys.stderr)
        return 2
    base = theirs[ccs[0]]
    steps = _noncritical(base)
    rows: list[dict[str, Any]] = []
    commands: dict[str, list[str]] = {}
    try:
        inputs = astra.write_inputs(base, out / "astra-inputs", args.chakra_python)
        for cc in ccs:
            key = _astra_key(inputs, cc, args.astra_sim)
            kept = cache.root / "astra" / f"{key}.json"
            commands[f"astra-sim {cc}"] = [args.astra_sim, *inputs.arguments(cc)]
            if kept.is_file() and not args.fresh:
                doc = json.loads(kept.read_text())
                say(f"study astra: ASTRA-sim, {cc}: from the cache ({kept})")
            else:
                say(f"study astra: ASTRA-sim, {cc}: running ({inputs.output(cc)})")
                try:
                    run = astra.run(args.astra_sim, inputs, cc, base.workload.steps, args.timeout)
                    doc = run.to_json()
                except astra.AstraUnfinished as err:
                    say(f"study astra: {err}")
                    doc = {"unfinished": str(err), "stopped_s": err.stopped_s,
                           "counters": err.counters}  # fmt: skip
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(json.dumps(doc))
            figures = (
                _unfinished(doc)
                if "unfinished" in doc
                else _theirs(astra.AstraRun(**doc), steps, base.workload.steps)
            )
            rows.append(_row("ASTRA-sim", "as shipped", cc, theirs[cc], figures))
        configs = list(ours.values())
        results = run_cached(
            configs, cache, run_one, fresh=args.fresh, workers=args.workers, say=say
        )
        for ((profile, cc), config), result in zip(ours.items(), results, strict=True):
            figures = _ours(result, steps, cache.folder(config))
            rows.append(_row("forgive", profile, cc, config, figures))
            commands[f"forgive {profile} {cc}"] = [str(cache.folder(config))]
    except astra.AstraError as err:
        print(f"forgive study astra: {err}", file=sys.stderr)
        return 1
    except RunError as err:
        print(f"forgive study astra: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("forgive study astra: interrupted", file=sys.stderr)
        return 130
    text = table(rows)
    meta = {
        "fabric": base.fabric.name,
        "byte_scale": base.fabric.scaling.byte_scale,
        "steps": base.workload.steps,
        "steps_read": steps,
        "tp_bytes": base.workload.tp_bytes,
        "allreduce_bound_ms": allreduce_bound_s(base) * 1e3,
        "astra_sim": str(Path(args.astra_sim).resolve()),
        "argv": sys.argv[1:],
    }
    (out / "table.txt").write_text(text + "\n")
    (out / "astra.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "commands": commands}, indent=1) + "\n"
    )
    with open(out / "astra.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(
        f"{base.fabric.name}, bytes / {base.fabric.scaling.byte_scale:g}, {base.workload.steps} "
        f"steps (non-critical: {','.join(map(str, steps))}), line-rate bound of the all-reduce "
        f"{meta['allreduce_bound_ms']:.2f} ms; figures at fabric scale"
    )
    print(text)
    say(f"\nresults: {out} (table.txt, astra.json, astra.csv)")
    return 0
