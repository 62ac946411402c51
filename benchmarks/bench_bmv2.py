"""How fast BMv2 forwards with the FORGIVE program, as ratios to a minimal program.

Runs, in one namespace and one run, plain `simple_switch` with
`benchmarks/minimal_forward.p4` (the reference) and `simple_switch_grpc` with
`p4src/forgive.p4`: with logging at debug level to a file (as the PTF suite
runs it), with the log level off, and, when `--nolog-prefix` holds a BMv2
built with --disable-logging-macros --disable-elogger, with that build. Each
switch is offered full 4154-byte DATA frames and 58-byte trimmed headers from
a raw socket faster than it can forward; the figure is frames per second
delivered on the egress veth, the median of `--rounds` rounds that visit the
cases in turn. Needs root, simple_switch, simple_switch_grpc and p4c-bm2-ss
(to compile the reference).

    sudo .venv/bin/python benchmarks/bench_bmv2.py [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing import Process
from pathlib import Path
from statistics import median

from controller import DEVICE_CONFIG, P4INFO
from ptf_tests.harness import AUX_PORT, GRPC_PORT, namespace
from ptf_tests.target import wait_for_listen
from ptf_tests.targets import Bmv2Target, Endpoint, bmv2_cli

HERE = Path(__file__).resolve().parent
REFERENCE_P4 = HERE / "minimal_forward.p4"
ETH_P_ALL = 0x0003
SO_RCVBUFFORCE = 33  # linux/socket.h; the socket module does not export it
DST = "10.0.2.9"
NHOP_MAC = "02:00:00:00:02:02"


@dataclass(frozen=True)
class Case:
    label: str
    program: str  # "forgive" | "reference"
    log_level: str
    binary: str


def cases(nolog_prefix: Path) -> list[Case]:
    found = [
        Case("reference: minimal program, simple_switch", "reference", "off", "simple_switch"),
        Case("forgive.p4, debug log to file", "forgive", "debug", Bmv2Target.BINARY),
        Case("forgive.p4, log level off", "forgive", "off", Bmv2Target.BINARY),
    ]
    nolog = nolog_prefix / "bin" / Bmv2Target.BINARY
    if nolog.exists():
        found.append(Case("forgive.p4, BMv2 built without logging", "forgive", "off", str(nolog)))
    return found


def frames() -> dict[str, bytes]:
    """The two frame kinds: a full DATA frame and a trimmed header."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    from common.wire import FORGIVE_UDP_PORT, PACKET_BYTES, Dscp, Flag
    from host_agent.scapy_layer import FTH

    def build(flags: int, payload: bytes) -> bytes:
        ip_len = 20 + 8 + 16 + len(payload)
        return bytes(
            Ether(dst="00:00:5e:00:53:01", src="02:00:00:00:00:01")
            / IP(src="10.0.1.1", dst=DST, tos=(Dscp.GRADIENT << 2) | 2, len=ip_len)
            / UDP(sport=49152, dport=FORGIVE_UDP_PORT, chksum=0)
            / FTH(flags=flags, length=PACKET_BYTES, flow_id=1, seq=0, aux=1 << 20)
            / Raw(payload)
        )

    return {
        "4154 B DATA": build(0, bytes(PACKET_BYTES)),
        "58 B trimmed header": build(int(Flag.TRIMMED), b""),
    }


def _blast(frame: bytes, seconds: float) -> None:
    os.nice(10)  # the switch, not the load generator, should get the CPU it needs
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind(("pt1", 0))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(64):
            try:
                tx.send(frame)
            except OSError:  # ENOBUFS: the veth queue is full, keep offering
                break


def measure(frame: bytes, seconds: float) -> float:
    """Frames per second that come out of pt2 while pt1 is offered `frame` flat out."""
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    rx.bind(("pt2", ETH_P_ALL))
    rx.settimeout(1.0)
    sender = Process(target=_blast, args=(frame, seconds))
    sender.start()
    count, first, last = 0, 0.0, 0.0
    try:
        while True:
            try:
                got = rx.recv(16384)
            except TimeoutError:
                if not sender.is_alive():
                    break
                continue
            if len(got) != len(frame):
                continue
            last = time.monotonic()
            if count == 0:
                first = last
            count += 1
    finally:
        sender.join()
        rx.close()
    if count < 2:
        raise RuntimeError(f"only {count} frames of {len(frame)} bytes came out")
    return (count - 1) / (last - first)


def configure_forgive(grpc_addr: str) -> object:
    from controller.session import SwitchSession
    from switch_model.surface import PMAX_ONE, Thresholds

    session = SwitchSession(grpc_addr, P4INFO, DEVICE_CONFIG)
    session.route("10.0.2.0/24", NHOP_MAC, 2)
    # managed port, limits out of reach: every admission test runs, nothing trims or marks
    session.set_thresholds(2, Thresholds(1 << 31, 1 << 30, 1 << 30, PMAX_ONE))
    return session


def inner(program: str, seconds: float) -> None:
    """Runs inside the namespace: configure the switch, measure, print JSON."""
    session = configure_forgive(f"127.0.0.1:{GRPC_PORT}") if program == "forgive" else None
    try:
        print(json.dumps({label: measure(f, seconds) for label, f in frames().items()}))
    finally:
        if session is not None:
            session.close()


def start_reference(ep: Endpoint, json_path: Path) -> subprocess.Popen:
    cmd = ["ip", "netns", "exec", ep.netns, "simple_switch", "--log-level", "off"]
    cmd += ["-i", "1@sw1", "-i", "2@sw2", "--thrift-port", str(ep.aux_port), str(json_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_listen(ep.netns, ep.aux_port, time.monotonic() + 30, proc)
    bmv2_cli(ep, f"set_queue_depth {Bmv2Target.QUEUE_DEPTH_PKTS}")  # same queues as forgive
    return proc


def _run_inner(cmd: list[str]) -> dict[str, float]:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"measurement failed: {res.stderr.strip().splitlines()[-1:]}")
    return json.loads(res.stdout)


def run_case(case: Case, ep: Endpoint, reference_json: Path, seconds: float) -> dict[str, float]:
    inner_cmd = ["ip", "netns", "exec", ep.netns, sys.executable, __file__]
    inner_cmd += ["--inner", case.program, "--seconds", str(seconds)]
    if case.program == "reference":
        proc = start_reference(ep, reference_json)
        try:
            return _run_inner(inner_cmd)
        finally:
            proc.terminate()
            proc.wait()
    else:
        switch = Bmv2Target(ep, log_level=case.log_level, binary=case.binary)
        try:
            switch.start()
            return _run_inner(inner_cmd)
        finally:
            switch.stop()


def missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in ("simple_switch", "simple_switch_grpc", "simple_switch_CLI", "p4c-bm2-ss"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="offered load per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all cases (median)")
    parser.add_argument(
        "--nolog-prefix",
        type=Path,
        default=Path("/opt/bmv2-nolog"),
        help="install prefix of a BMv2 built without logging (case skipped if absent)",
    )
    parser.add_argument("--inner", choices=("forgive", "reference"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args.inner, args.seconds)
        return 0
    reason = missing()
    if reason:
        print(f"bench_bmv2: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="forgive-bench-") as tmp:
        tmpdir = Path(tmp)
        reference_json = tmpdir / "minimal_forward.json"
        subprocess.run(
            ["p4c-bm2-ss", "--arch", "v1model", "-o", str(reference_json), str(REFERENCE_P4)],
            check=True,
        )
        todo = cases(args.nolog_prefix)
        samples: dict[str, dict[str, list[float]]] = {c.label: {} for c in todo}
        netns = f"fgbench{os.getpid()}"
        with namespace(netns) as ports:
            ep = Endpoint(netns, ports, GRPC_PORT, AUX_PORT, tmpdir)
            try:
                for _ in range(args.rounds):
                    for case in todo:
                        for kind, pps in run_case(case, ep, reference_json, args.seconds).items():
                            samples[case.label].setdefault(kind, []).append(pps)
            except RuntimeError as exc:
                print(f"bench_bmv2: {exc}", file=sys.stderr)
                return 1
    result = {label: {k: median(v) for k, v in kinds.items()} for label, kinds in samples.items()}
    reference = result[todo[0].label]
    print(f"median of {args.rounds} rounds, {args.seconds:g} s of offered load each")
    print(f"{'case':<44} {'frame':<22} {'frames/s':>10} {'vs reference':>13}")
    for case in todo:
        for kind, pps in result[case.label].items():
            print(f"{case.label:<44} {kind:<22} {pps:>10.0f} {pps / reference[kind]:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
