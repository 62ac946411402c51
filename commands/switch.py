"""`forgive-switch`: run one model switch on real interfaces until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

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
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    ports = dict(args.interface)
    if len(ports) != len(args.interface):
        parser.error("a port number is given twice")
    unknown = [p for p, _ in args.rate if p not in ports]
    if unknown:
        parser.error(f"--rate for port(s) {unknown} that have no interface")
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
        dataplane.open()
        server = serve(SwitchService(args.device_id, dataplane), args.grpc)
    except OSError as err:
        dataplane.close()
        print(f"forgive-switch {args.name}: {err}", file=sys.stderr)
        return 1
    control = ControlServer(args.control, dataplane)
    dataplane.start()
    control.start()
    logging.info("running: ports %s, P4Runtime %s, control %s", args.ports, args.grpc, args.control)
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
