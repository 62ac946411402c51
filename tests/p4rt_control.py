"""A test fixture: configures a running switch (BMv2 or the model) over P4Runtime from inside its namespace.

Run with `ip netns exec`; P4Runtime listens on the switch namespace's loopback.
Pushes forgive.p4, installs one /32 route per `IP=MAC=PORT` and the given
thresholds on every routed port, prints `ready`, and keeps the primary session
until a line (or EOF) arrives on stdin; then prints every routed port's
counters as one JSON object and exits.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from controller import DEVICE_CONFIG, P4INFO
from controller.session import SwitchSession
from ptf_tests.harness import GRPC_PORT
from switch_model.surface import Thresholds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("routes", nargs="+", metavar="IP=MAC=PORT")
    parser.add_argument("--thresholds", required=True, metavar="DATA_QUEUE,KMIN,KMAX,PMAX")
    args = parser.parse_args()
    thresholds = Thresholds(*(int(x) for x in args.thresholds.split(",")))
    session = SwitchSession(f"127.0.0.1:{GRPC_PORT}", P4INFO, DEVICE_CONFIG)
    try:
        ports = []
        for spec in args.routes:
            ip, mac, port = spec.split("=")
            session.route(f"{ip}/32", mac, int(port))
            session.set_thresholds(int(port), thresholds)
            ports.append(int(port))
        print("ready", flush=True)
        sys.stdin.readline()
        print(json.dumps({port: asdict(session.port_counters(port)) for port in ports}))
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
