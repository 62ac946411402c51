"""`forgive impact RESULTS_DIR`: replay a results folder's recorded loss into a real model.

Registered as a subcommand of `forgive` (commands.forgive) without importing
PyTorch, so the emulation commands work where the `impact` extra is absent.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from impact.config import ImpactConfig, ModelSpec
from impact.masks import COMPARISONS

DESCRIPTION = (
    "train an MLP on the bundled digits with one data-parallel replica per rank, all-reducing "
    f"along the run's ring with its recorded loss applied; compare {', '.join(COMPARISONS)} "
    "under zero-fill and renormalisation; measure replica drift against both closed forms; "
    "replay the Accordion detector over the training's gradient norms"
)


def register(sub: argparse._SubParsersAction) -> None:
    config, spec = ImpactConfig(), ModelSpec()
    p = sub.add_parser(
        "impact", help="what the recorded loss does to a real model", description=DESCRIPTION
    )
    p.add_argument(
        "results", type=Path, metavar="RESULTS_DIR", help="a forgive run or compare folder"
    )
    p.add_argument(
        "--policy", help="whose recorded loss to replay (default: forgive, or the only one)"
    )
    p.add_argument(
        "--seeds",
        default=",".join(map(str, config.seeds)),
        help="training seeds (default %(default)s)",
    )
    p.add_argument("--out", type=Path, help="output folder (default RESULTS_DIR/impact)")
    p.add_argument(
        "--hidden", type=int, default=spec.hidden, help="MLP hidden width (default %(default)s)"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=spec.batch,
        help="images per replica per step (default %(default)s)",
    )
    p.add_argument(
        "--lr", type=float, default=spec.lr, help="Adam's learning rate (default %(default)s)"
    )
    p.add_argument(
        "--drift-steps",
        type=int,
        default=config.drift_steps,
        help="steps of the drift measurement (default %(default)s)",
    )
    p.add_argument(
        "--drift-p",
        type=float,
        default=config.drift_p,
        help="independent drop rate (default %(default)s)",
    )
    p.add_argument(
        "--burn-in",
        type=int,
        default=config.burn_in,
        help="drift steps not averaged (default %(default)s)",
    )
    p.add_argument(
        "--threads", type=int, default=config.threads, help="PyTorch threads (default %(default)s)"
    )


def main(args: argparse.Namespace) -> int:
    try:
        import sklearn  # noqa: F401
        import torch  # noqa: F401
    except ImportError as err:
        print(
            f"forgive impact: needs the impact extra ({err.name} missing): pip install -e '.[impact]'",
            file=sys.stderr,
        )
        return 2
    from impact.experiment import ImpactError, choose_runs, run
    from impact.report import write
    from runs.report import IMPACT, RUNS, read_runs, writable_folder

    try:
        seeds = tuple(int(s) for s in args.seeds.split(",") if s)
    except ValueError:
        print(
            f"forgive impact: bad --seeds {args.seeds!r}: integers, comma-separated",
            file=sys.stderr,
        )
        return 2
    try:
        config = ImpactConfig(
            spec=ModelSpec(hidden=args.hidden, batch=args.batch, lr=args.lr),
            seeds=seeds,
            drift_steps=args.drift_steps,
            drift_p=args.drift_p,
            burn_in=args.burn_in,
            threads=args.threads,
        )
        config.validate()
        if not (args.results / RUNS).is_file():
            raise ImpactError(f"{args.results} has no {RUNS} (not a forgive results folder)")
        runs = read_runs(args.results)
        replays = choose_runs(runs, args.policy, config.seeds)
        out = writable_folder(args.out or args.results / IMPACT, "--out")
    except (ValueError, TypeError, KeyError, ImpactError, OSError) as err:
        print(f"forgive impact: {err}", file=sys.stderr)
        return 2
    for r in replays:
        print(f"seed {r.seed} replays {r.run_policy} seed {r.run_seed}", file=sys.stderr)
    results = run(config, replays)
    print(write(out, results))
    print(
        f"\nresults: {out} (table.txt, impact.json, loss_curves.png, accuracy_curves.png, drift.png)",
        file=sys.stderr,
    )
    return 0
