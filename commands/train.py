"""`forgive-train`: one rank of an emulated data-parallel job and its host agent, in one process.

The rank (`workload.rank.Rank`) and the host below it are sans-IO state
machines; this program is their raw-socket driver. `forgive run` gives it
everything as one JSON object, its host's entry of the run plan (`--host`:
`workload.hostplan.HostEntry.to_json()`). Run by hand, it takes the agent's
options of `forgive-agent` and the training settings as one JSON object
(`--config`: `TrainingConfig.to_json()`) or as flags named after the fields of
`workload.plan.TrainingConfig`; flags given beside `--config` override it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

from commands.agent import agent_arguments, config_from, exit_on_signals
from host_agent.agent import AgentConfig, HostAgent
from host_agent.host import HostConfig
from workload.hostplan import HostEntry
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
            metavar=flag[2:].upper().replace("-", "_"),
            help=f"default {_shown(default)}",
        )


def _shown(default: object) -> str:
    """A default as it is typed: a list comma-separated, an empty one as none."""
    if isinstance(default, tuple):
        return ",".join(map(str, default)) if default else "none"
    return str(default)


def _int_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of integers, as `--misclassify 1,2,3` gives it."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas: {text!r}"
        ) from None


def training_config(args: argparse.Namespace) -> TrainingConfig:
    """The JSON of `--config` with every flag given on top, validated; its critical steps as
    StaticSchedule.of keeps them (sorted, `()` for the note's: `--critical 1,2,3,20` is the
    note's schedule, as the runner hands it over), once merged, so that `--steps` on top of
    a config naming 1, 2, 3 and 5 of five steps keeps step 5."""
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
    cfg = TrainingConfig.from_dict(values)
    return dataclasses.replace(cfg, critical=cfg.schedule().setting())


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forgive-train", description=__doc__)
    agent_arguments(parser)
    parser.set_defaults(seed=None)  # the training configuration's seed unless given
    training_arguments(parser)
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this, s")
    parser.add_argument("--out", default="-", help="JSON-lines training records ('-': stdout)")
    return parser


def agent_config(entry: HostEntry) -> AgentConfig:
    """The raw-socket agent of a run plan's host entry: its endpoint on the host's
    interface, every frame to the leaf port it hangs off."""
    host = HostConfig(
        ip=entry.ip, endpoint=entry.endpoint, gateway_mac=entry.gateway_mac, spray=entry.spray
    )
    return AgentConfig(iface=entry.iface, host=host, stats_path=entry.stats_file)


def _from_flags(args: argparse.Namespace) -> tuple[AgentConfig, TrainingConfig]:
    cfg = training_config(args)
    args.seed = cfg.seed
    config = config_from(args)
    ip = config.host.ip
    if ip is not None and ip != cfg.ranks[cfg.rank]:
        raise ValueError(f"--ip {ip} is not rank {cfg.rank}'s address")
    config.host.ip = cfg.ranks[cfg.rank]
    return config, cfg


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    by_entry = argparse.ArgumentParser(add_help=False)
    by_entry.add_argument("--host")
    given, rest = by_entry.parse_known_args(argv)
    try:
        if given.host is None:
            args = arguments().parse_args(argv)
            config, cfg = _from_flags(args)
            out_path, timeout = args.out, args.timeout
        else:
            if rest:
                raise ValueError(f"--host takes no other option, got {' '.join(rest)}")
            entry = HostEntry.from_json(given.host)
            config, cfg = agent_config(entry), entry.training
            out_path, timeout = entry.train_file, entry.timeout_s
        agent = HostAgent(config)
    except (ValueError, OSError) as exc:
        print(f"forgive-train: {exc}", file=sys.stderr)
        return 2
    exit_on_signals()
    out = sys.stdout if out_path == "-" else open(out_path, "w", encoding="utf-8")  # noqa: SIM115
    rank = Rank(
        cfg, agent.endpoint, out, warn=lambda m: print(f"forgive-train: {m}", file=sys.stderr)
    )
    agent.apps.append(rank)
    deadline = time.monotonic() + timeout
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
        print(f"forgive-train: rank {cfg.rank} timed out after {timeout} s", file=sys.stderr)
        return 1
    return 1 if rank.failed else 0


if __name__ == "__main__":
    sys.exit(main())
