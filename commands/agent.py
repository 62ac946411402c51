"""`forgive-agent`: one emulated host's agent, serving the local API on a Unix socket."""

from __future__ import annotations

import argparse
import signal
import sys

from host_agent.agent import AgentConfig, HostAgent
from host_agent.api import ApiServer, check_api_path
from host_agent.core import CONTROLS, PROFILES
from host_agent.endpoint import EndpointConfig
from host_agent.host import HostConfig
from host_agent.policies import DEFAULT_POLICY, POLICY_NAMES, parse_policy

_ENDPOINT = EndpointConfig()
"""The endpoint's defaults, which the options below take as theirs."""


def agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every program that runs an agent shares (also `forgive-train`)."""
    parser.add_argument("--iface", required=True, help="the host's interface, e.g. h1-eth0")
    parser.add_argument("--ip", help="this host's IPv4 address (default: the interface's)")
    parser.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        help=f"one of {', '.join(POLICY_NAMES)} (default {DEFAULT_POLICY})",
    )
    parser.add_argument(
        "--seed", type=int, default=_ENDPOINT.seed, help="shared seed of every random draw"
    )
    parser.add_argument(
        "--line-rate",
        type=float,
        default=_ENDPOINT.line_rate_bps,
        help=f"DCQCN line rate in bit/s (default {_ENDPOINT.line_rate_bps:g})",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=_ENDPOINT.time_scale,
        help="emulation slowdown against the modelled fabric; stretches DCQCN's timers (1)",
    )
    parser.add_argument(
        "--dcqcn",
        default=_ENDPOINT.dcqcn,
        help=f"DCQCN profile: {' or '.join(PROFILES)} (default {_ENDPOINT.dcqcn}; docs/dcqcn.md)",
    )
    parser.add_argument(
        "--cc",
        default=_ENDPOINT.cc,
        help=f"congestion control: {' or '.join(CONTROLS)} (default {_ENDPOINT.cc}; docs/nscc.md)",
    )
    parser.add_argument(
        "--window-bytes",
        type=float,
        default=_ENDPOINT.window_bytes,
        help="sender window per flow at the line rate, bytes (default 0: none)",
    )
    parser.add_argument(
        "--qp-state",
        action="store_true",
        help="keep DCQCN's state per peer and traffic class across messages",
    )
    parser.add_argument(
        "--payload-bytes",
        type=int,
        default=_ENDPOINT.payload_bytes,
        help=f"DATA bytes per packet ({_ENDPOINT.payload_bytes})",
    )
    parser.add_argument(
        "--rto", type=float, default=_ENDPOINT.rto, help="initial retransmission timeout, s"
    )
    parser.add_argument(
        "--rto-max", type=float, default=_ENDPOINT.rto_max, help="largest backed-off RTO, s"
    )
    parser.add_argument(
        "--max-timeouts",
        type=int,
        default=_ENDPOINT.max_timeouts,
        help=f"timeouts in a row without progress before a flow fails ({_ENDPOINT.max_timeouts})",
    )
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
    parser.add_argument(
        "--trim-dscp",
        action="append",
        default=[],
        metavar="LOCATION=DSCP",
        help="trimmed headers arriving with DSCP were trimmed at LOCATION (host: the last "
        "hop, fabric: inside it), as the switches' asymmetric trim DSCP sets (repeatable)",
    )
    parser.add_argument(
        "--no-payload",
        action="store_true",
        help="keep no received bytes (flows cannot be delivered; saves memory and copies)",
    )


def config_from(args: argparse.Namespace) -> AgentConfig:
    """Build and validate the agent's configuration; ValueError names the first bad option."""
    neighbors = {}
    for entry in args.neighbor:
        ip, sep, mac = entry.partition("=")
        if not sep:
            raise ValueError(f"--neighbor {entry!r}: expected IP=MAC")
        neighbors[ip] = mac
    locations = {}
    for entry in args.trim_dscp:
        where, sep, dscp = entry.partition("=")
        if not sep or not dscp.isdecimal():
            raise ValueError(f"--trim-dscp {entry!r}: expected LOCATION=DSCP")
        if int(dscp) in locations:
            raise ValueError(f"--trim-dscp {entry!r}: DSCP {dscp} already has a location")
        locations[int(dscp)] = where
    endpoint = EndpointConfig(
        policy=parse_policy(args.policy),
        seed=args.seed,
        line_rate_bps=args.line_rate,
        time_scale=args.time_scale,
        rto=args.rto,
        rto_max=args.rto_max,
        max_timeouts=args.max_timeouts,
        keep_payload=not args.no_payload,
        trim_locations=locations,
        dcqcn=args.dcqcn,
        cc=args.cc,
        window_bytes=args.window_bytes,
        qp_state=args.qp_state,
        payload_bytes=args.payload_bytes,
    )
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
