"""`forgive-switch`: run one model switch on real interfaces until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import sys
import threading
from pathlib import Path

from common.tls import ServerTls, TlsError
from switch_model.control import ControlServer
from switch_model.dataplane import Dataplane
from switch_model.p4runtime_server import SwitchService, serve

MAX_PORT = 511


def _port_map(text: str) -> tuple[int, str]:
    number, sep, ifname = text.partition("=")
    if not sep or not number.isdigit() or not ifname:
        raise argparse.ArgumentTypeError(f"expected PORT=IFNAME, got {text!r}")
    if int(number) > MAX_PORT:
        raise argparse.ArgumentTypeError(f"port {number} outside 0..{MAX_PORT}")
    return int(number), ifname


def _port_rate(text: str) -> tuple[int, int]:
    number, sep, rate = text.partition("=")
    try:
        value = int(float(rate))
    except ValueError:
        value = -1
    if not sep or not number.isdigit() or value < 0:
        raise argparse.ArgumentTypeError(f"expected PORT=BITS_PER_SECOND, got {text!r}")
    return int(number), value


def _private(address: str) -> bool:
    """Whether a listen address is reachable only from this machine (a loopback address, or
    a Unix socket): there P4Runtime without TLS is the default the docs allow."""
    if address.startswith("unix:"):
        return True
    host = address.rpartition(":")[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="forgive-switch", description=__doc__)
    parser.add_argument("--name", default="s1", help="switch name, used in logs")
    parser.add_argument(
        "-i",
        "--interface",
        type=_port_map,
        action="append",
        required=True,
        metavar="PORT=IFNAME",
        help="attach a port to an interface (repeatable)",
    )
    parser.add_argument("--grpc", default="127.0.0.1:9559", help="P4Runtime listen address")
    parser.add_argument("--device-id", type=int, default=1)
    parser.add_argument(
        "--control", default=None, help="control socket path (default /tmp/forgive-NAME.sock)"
    )
    parser.add_argument(
        "--rate",
        type=_port_rate,
        action="append",
        default=[],
        metavar="PORT=BPS",
        help="line rate of one port in bits/s (repeatable; default unpaced)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the ECN marking draw")
    tls = parser.add_argument_group(
        "P4Runtime over TLS (docs/switch_model.md: off by default, for loopback and namespaces)"
    )
    tls.add_argument("--tls-cert", type=Path, metavar="PEM", help="the switch's certificate")
    tls.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")
    tls.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="PEM",
        help="accept only clients with a certificate this CA signed (mutual TLS)",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    ports = dict(args.interface)
    if len(ports) != len(args.interface):
        parser.error("a port number is given twice")
    unknown = [p for p, _ in args.rate if p not in ports]
    if unknown:
        parser.error(f"--rate for port(s) {unknown} that have no interface")
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key")
    args.tls = (
        None
        if args.tls_cert is None
        else ServerTls(args.tls_cert, args.tls_key, args.tls_client_ca)
    )
    args.ports = ports
    args.control = args.control or f"/tmp/forgive-{args.name}.sock"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s {args.name} %(name)s %(levelname)s %(message)s",
    )
    dataplane = Dataplane(args.ports, seed=args.seed)
    for port, rate in args.rate:
        dataplane.set_shaping(port, rate, None, None)
    try:
        if args.tls is not None:
            args.tls.pems()  # a bad file is one line before any port is opened
    except TlsError as err:
        print(f"forgive-switch {args.name}: {err}", file=sys.stderr)
        return 2
    try:
        dataplane.open()
        server = serve(SwitchService(args.device_id, dataplane), args.grpc, args.tls)
    except OSError as err:
        dataplane.close()
        print(f"forgive-switch {args.name}: {err}", file=sys.stderr)
        return 1
    if args.tls is None and not _private(args.grpc):
        logging.warning(
            "P4Runtime on %s without TLS: whoever reaches it can take the switch over "
            "(--tls-cert, --tls-key, --tls-client-ca; docs/switch_model.md)",
            args.grpc,
        )
    control = ControlServer(args.control, dataplane)
    dataplane.start()
    control.start()
    over = ""
    if args.tls is not None:
        over = " over mutual TLS" if args.tls.client_ca is not None else " over TLS"
    logging.info(
        "running: ports %s, P4Runtime %s%s, control %s", args.ports, args.grpc, over, args.control
    )
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(0.5) and dataplane.alive():
        pass
    server.stop(grace=0.5).wait()
    control.stop()
    crashed = not dataplane.alive()
    dataplane.stop()
    if crashed:
        logging.error("the packet loop died; stopping")
        return 1
    logging.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
