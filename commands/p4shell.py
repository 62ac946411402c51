"""`forgive-ctl shell SWITCH`: p4runtime-shell on a running FORGIVE switch, beside the run's controller.

SWITCH is a switch's name in a fabric description (`--topology`; a run under Mininet writes
its own, `fabric.json` in the run's folder) or a switch's gRPC address, HOST:PORT
(`--device-id`, default 1). The switch may be the model or BMv2. The shell names tables,
actions and counters by the P4Info the switch runs, the one the controller gave it (forgive's,
p4src/build/forgive.p4info.txtpb): `CounterEntry("ForgiveIngress.port_trims").read()`,
`TableEntry("ForgiveIngress.ipv4_lpm").read()`, and so on.

Arbitration, by P4Runtime's rule (the specification's "Client Arbitration and Controller
Replication"): each client opens a stream to the device with an election id, the client with
the highest id the device has seen is primary, only the primary may Write or set the pipeline,
and every client may Read. The run's controller asks for election id 1
(`controller.client.ELECTION_ID`); the shell asks for 0, below it, so it is a backup whether it
comes before or after the controller, never takes the switch from it, and reads every table and
counter mid-run; its writes are refused (PERMISSION_DENIED) while the controller holds the
switch. Only on a switch no controller has reached since it started is the shell primary.

Without `-c` it opens p4runtime-shell's IPython prompt; `-c CODE` runs CODE with the prompt's
names (TableEntry, CounterEntry, tables, counters, ...) and exits, for scripts. Any refusal is
one line on stderr: exit 2 for bad input, 1 for a switch that does not answer.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import grpc

from commands.tls_options import add_tls_options, client_tls
from common.tls import ClientTls, TlsError
from controller.client import ELECTION_ID, SwitchClient, SwitchUnreachable
from controller.p4info import ConfigError
from controller.topology import load

SHELL_ELECTION_ID = (0, ELECTION_ID - 1)
"""(high, low) of the shell's election id: one below the controller's, so never primary
beside it."""
PROMPT_NAMES = (
    "TableEntry", "MatchKey", "Action", "CounterEntry", "DirectCounterEntry", "MeterEntry",
    "DirectMeterEntry", "ActionProfileMember", "GroupMember", "ActionProfileGroup",
    "OneshotAction", "Oneshot", "Write", "Replica", "MulticastGroupEntry", "CloneSessionEntry",
    "DigestEntry", "APIVersion",
)  # fmt: skip
"""The names p4runtime-shell's prompt offers that `-c` offers too (with `p4info` and one
listing per kind of P4 object: `tables`, `counters`, ...)."""


@dataclass(frozen=True)
class Target:
    """Where the shell connects."""

    name: str
    grpc: str
    device_id: int


def target(switch: str, topology: str | None, device_id: int | None) -> Target:
    """The switch a name in a description, or an address, stands for; ConfigError in one line."""
    if topology is not None:
        fabric = load(topology)
        if switch not in fabric.switches:
            raise ConfigError(
                f"no switch {switch!r} in {topology} (it has {', '.join(sorted(fabric.switches))})"
            )
        if device_id is not None:
            raise ConfigError("--device-id is the description's with --topology")
        spec = fabric.switches[switch]
        return Target(switch, spec.grpc, spec.device_id)
    host, _, port = switch.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"SWITCH {switch!r}: a switch's name needs --topology DESCRIPTION.json; "
            "without it SWITCH is a gRPC address, HOST:PORT"
        )
    return Target(switch, switch, 1 if device_id is None else device_id)


def check_pipeline(where: Target, tls: ClientTls | None = None) -> None:
    """Read the switch's pipeline as any client may: SwitchUnreachable if it does not answer,
    ConfigError if it runs none yet (the controller has not configured it)."""
    reader = SwitchClient(where.name, where.grpc, where.device_id, tls=tls)
    none_yet = ConfigError(
        f"{where.name}: the switch runs no pipeline yet (the run's controller gives it forgive's "
        "when it configures the switch)"
    )
    try:
        reader.connect(primary=False)
        if not reader.get_pipeline().p4info.tables:
            raise none_yet
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
            raise none_yet from None
        raise SwitchUnreachable(
            f"{where.name}: P4Runtime {err.code().name}: {err.details()}"
        ) from None
    finally:
        reader.close()


def _shell_tls(tls: ClientTls | None) -> list[str]:
    """p4runtime-shell's own options for the same TLS (its prompt parses its command line)."""
    if tls is None:
        return []
    options = ["--ssl", "--cacert", str(tls.ca)]
    if tls.cert is not None and tls.key is not None:
        options += ["--cert", str(tls.cert), "--private-key", str(tls.key)]
    return options


def _ssl_options(tls: ClientTls | None):
    """p4runtime-shell's SSLOptions for `setup` (insecure without TLS)."""
    from p4runtime_sh.p4runtime import SSLOptions

    if tls is None:
        return SSLOptions(True)
    cert = None if tls.cert is None else str(tls.cert)
    key = None if tls.key is None else str(tls.key)
    return SSLOptions(False, str(tls.ca), cert, key)


def names() -> dict:
    """The prompt's names, for `-c`."""
    from p4runtime_sh import shell as sh
    from p4runtime_sh.context import P4Type

    found = {name: getattr(sh, name) for name in PROMPT_NAMES}
    found["p4info"] = sh.context.p4info
    for kind in P4Type:
        found[kind.p4info_name] = sh.P4Objects(kind)
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="forgive-ctl shell",
        description=__doc__.splitlines()[0],
        epilog="The shell is a backup client (election id 0, below the controller's 1): it "
        "reads everything and never takes the switch from the run's controller.",
    )
    parser.add_argument("switch", metavar="SWITCH", help="a name in --topology, or HOST:PORT")
    parser.add_argument(
        "--topology",
        metavar="DESCRIPTION",
        help="the fabric description naming SWITCH (a Mininet run writes fabric.json in its "
        "run folder)",
    )
    parser.add_argument(
        "--device-id", type=int, help="P4Runtime device id at HOST:PORT (default 1)"
    )
    parser.add_argument("-c", dest="code", metavar="CODE", help="run CODE in the shell and exit")
    add_tls_options(parser)
    args = parser.parse_args(argv)
    try:
        from p4runtime_sh import shell as sh
    except ImportError:
        print(
            "forgive-ctl: shell needs p4runtime-shell (pip install p4runtime-shell==0.0.6; "
            "make setup installs it)",
            file=sys.stderr,
        )
        return 2
    try:
        tls = client_tls(args)
        if tls is not None and tls.server_name:
            raise ConfigError("--tls-server-name: p4runtime-shell checks the address's own name")
        where = target(args.switch, args.topology, args.device_id)
        check_pipeline(where, tls)
    except (ConfigError, TlsError) as err:
        print(f"forgive-ctl: {err}", file=sys.stderr)
        return 2
    except SwitchUnreachable as err:
        print(f"forgive-ctl: {err}", file=sys.stderr)
        return 1
    election = ",".join(map(str, SHELL_ELECTION_ID))
    address = ["--grpc-addr", where.grpc, "--device-id", str(where.device_id)]
    if args.code is None:
        sys.argv = ["forgive-ctl shell", *address, "--election-id", election, *_shell_tls(tls)]
        sh.main()
        return 0
    try:
        sh.setup(
            where.device_id, where.grpc, SHELL_ELECTION_ID, ssl_options=_ssl_options(tls),
            verbose=False,
        )  # fmt: skip
    except SystemExit:  # p4runtime-shell logged why; a switch lost since the check above
        print(f"forgive-ctl: {where.name}: p4runtime-shell could not connect", file=sys.stderr)
        return 1
    try:
        exec(
            compile(args.code, "<-c>", "exec"), names()
        )  # the user's own code, as python -c runs it
    finally:
        sh.teardown()
    return 0
