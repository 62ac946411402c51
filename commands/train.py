"""`forgive-train`: one rank of an emulated data-parallel job and its host agent, in one process.

The rank (`workload.rank.Rank`) and the host below it are sans-IO state
machines; this program is their raw-socket driver. The training settings
come either as one JSON object (`--config`, the form `forgive run` uses:
`TrainingConfig.to_json()`) or as flags named after the fields of
`workload.plan.TrainingConfig`; flags given beside `--config` override it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

from commands.agent import agent_arguments, config_from, exit_on_signals
from host_agent.agent import HostAgent
from workload.plan import TrainingConfig
from workload.rank import Rank

_SPECIAL = {"ranks", "rank", "seed"}
"""Fields with a flag of their own: `--ranks` is comma-separated; `--seed` is the agent's."""


def training_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainingConfig field, named after it, all optional beside `--config`."""
    parser.add_argument("--config", help="every training setting as one JSON object")
    parser.add_argument("--ranks", default=argparse.SUPPRESS, help="IPv4 of every rank, a,b,..")
    parser.add_argument(
        "--rank", type=int, default=argparse.SUPPRESS, help="this host's index in --ranks"
    )
    for f in dataclasses.fields(TrainingConfig):
        if f.name in _SPECIAL:
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        if f.type.startswith("tuple"):
            kind = _int_list
        else:
            kind = float if "float" in f.type else int if "int" in f.type else str
        scale = f.metadata.get("scale")
        default = f.default / scale if scale else f.default
        parser.add_argument(
            flag,
            dest=f.name,
            type=kind,
            default=argparse.SUPPRESS,
            help=f"default {default}",
        )


def _int_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of integers, as `--misclassify 1,2,3` gives it."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas: {text!r}"
        ) from None


def training_config(args: argparse.Namespace) -> TrainingConfig:
    """The JSON of `--config` with every flag given on top; validated here, once."""
    values: dict[str, Any] = {}
    if args.config is not None:
        values = dataclasses.asdict(TrainingConfig.from_json(args.config))
    for f in dataclasses.fields(TrainingConfig):
        if f.name in vars(args) and f.name != "seed":
            scale = f.metadata.get("scale")
            value = getattr(args, f.name)
            values[f.name] = value * scale if scale else value
    if args.seed is not None:
        values["seed"] = args.seed
    return TrainingConfig.from_dict(values)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forgive-train", description=__doc__)
    agent_arguments(parser)
    parser.set_defaults(seed=None)  # the training configuration's seed unless given
    training_arguments(parser)
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this, s")
    parser.add_argument("--out", default="-", help="JSON-lines training records ('-': stdout)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    try:
        cfg = training_config(args)
        args.seed = cfg.seed
        agent_config = config_from(args)
        ip = agent_config.host.ip
        if ip is not None and ip != cfg.ranks[cfg.rank]:
            raise ValueError(f"--ip {ip} is not rank {cfg.rank}'s address")
        agent_config.host.ip = cfg.ranks[cfg.rank]
        agent = HostAgent(agent_config)
    except (ValueError, OSError) as exc:
        print(f"forgive-train: {exc}", file=sys.stderr)
        return 2
    exit_on_signals()
    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
    rank = Rank(
        cfg, agent.endpoint, out, warn=lambda m: print(f"forgive-train: {m}", file=sys.stderr)
    )
    agent.apps.append(rank)
    deadline = time.monotonic() + args.timeout
    try:
        rank.start(agent.now())
        agent.run(until=lambda: rank.finished or time.monotonic() > deadline)
    except KeyboardInterrupt:
        return 130
    finally:
        agent.close()
        if out is not sys.stdout:
            out.close()
    if rank.failure is not None:
        print(f"forgive-train: rank {cfg.rank}: {rank.failure}", file=sys.stderr)
        return 1
    if not rank.finished:
        print(f"forgive-train: rank {cfg.rank} timed out after {args.timeout} s", file=sys.stderr)
        return 1
    return 1 if rank.failed else 0


if __name__ == "__main__":
    sys.exit(main())
