"""`forgive-agent`: one emulated host's agent, serving the local API on a Unix socket."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys

from host_agent.agent import AgentConfig, HostAgent
from host_agent.api import ApiServer, check_api_path
from host_agent.endpoint import EndpointConfig
from host_agent.host import HostConfig

_ENDPOINT = EndpointConfig().to_dict()
"""The endpoint's defaults in its JSON form, which the options below take as theirs."""


def endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per EndpointConfig field, named after it or by its `flag` metadata, its help
    from the metadata and its default the field's own: a switch for a bool (`--no-...` where
    the default is on), LOCATION=DSCP (repeatable) for the trim locations."""
    for f in dataclasses.fields(EndpointConfig):
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        default = _ENDPOINT[f.name]
        text = f.metadata["help"]
        if isinstance(default, bool):
            action = "store_false" if default else "store_true"
            parser.add_argument(flag, dest=f.name, action=action, help=text)
        elif isinstance(default, dict):
            parser.add_argument(
                flag, dest=f.name, action="append", default=[], metavar="LOCATION=DSCP", help=text
            )
        else:
            if isinstance(default, float):
                text += f" (default {default:g})"
            elif default is not None:
                text += f" (default {default})"
            kind = int if default is None else type(default)
            parser.add_argument(flag, dest=f.name, type=kind, default=default, help=text)


def agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every program that runs an agent shares (also `forgive-train`)."""
    parser.add_argument("--iface", required=True, help="the host's interface, e.g. h1-eth0")
    parser.add_argument("--ip", help="this host's IPv4 address (default: the interface's)")
    endpoint_arguments(parser)
    parser.add_argument(
        "--no-spray",
        action="store_true",
        help="one UDP source port per flow instead of one per packet",
    )
    parser.add_argument(
        "--neighbor",
        action="append",
        default=[],
        metavar="IP=MAC",
        help="static neighbour entry (repeatable); others are resolved by ARP",
    )
    parser.add_argument("--gateway-mac", help="next-hop MAC for every non-static destination")
    parser.add_argument("--stats", default="-", help="JSON-lines statistics file ('-': stdout)")


def config_from(args: argparse.Namespace) -> AgentConfig:
    """Build and validate the agent's configuration; ValueError names the first bad option."""
    neighbors = {}
    for entry in args.neighbor:
        ip, sep, mac = entry.partition("=")
        if not sep:
            raise ValueError(f"--neighbor {entry!r}: expected IP=MAC")
        neighbors[ip] = mac
    locations: dict[str, str] = {}
    for entry in args.trim_locations:
        where, sep, dscp = entry.partition("=")
        if not sep or not dscp.isdecimal():
            raise ValueError(f"--trim-dscp {entry!r}: expected LOCATION=DSCP")
        if str(int(dscp)) in locations:
            raise ValueError(f"--trim-dscp {entry!r}: DSCP {dscp} already has a location")
        locations[str(int(dscp))] = where
    values = {name: getattr(args, name) for name in _ENDPOINT}
    endpoint = EndpointConfig.from_dict({**values, "trim_locations": locations})
    host = HostConfig(
        ip=args.ip,
        endpoint=endpoint,
        spray=not args.no_spray,
        neighbors=neighbors,
        gateway_mac=args.gateway_mac,
    )
    config = AgentConfig(iface=args.iface, host=host, stats_path=args.stats)
    config.validate()
    return config


def exit_on_signals() -> None:
    """Turn SIGTERM into SystemExit so every `finally` cleans up, as Ctrl-C already does."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="forgive-agent", description=__doc__)
    agent_arguments(parser)
    parser.add_argument("--api", required=True, help="path of the local API's Unix socket")
    args = parser.parse_args(argv)
    try:
        config = config_from(args)
        check_api_path(args.api)
        agent = HostAgent(config)
    except (ValueError, OSError) as exc:
        print(f"forgive-agent: {exc}", file=sys.stderr)
        return 2
    exit_on_signals()
    server = ApiServer(agent, args.api)
    try:
        agent.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
