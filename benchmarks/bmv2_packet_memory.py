"""How much resident memory BMv2 holds per packet queued, with the FORGIVE program.

The soak (docs/soak.md) sets a switch's memory against its queues; this measures what a
queued packet costs BMv2. In one namespace, `simple_switch_grpc` with `p4src/forgive.p4`
(log level off) routes to port 2, whose two queues are drained at 1 packet/s, so what is
sent stays queued. It is sent `--batch` frames at a time (paced, so that BMv2's ingress
keeps up and nothing is lost before the queue), alternately full 4154-byte DATA frames
and 58-byte trimmed headers (the high queue), and the switch's VmRSS is read after each
batch; the figure is the RSS added per packet queued. Needs root and simple_switch_grpc.

    sudo .venv/bin/python benchmarks/bmv2_packet_memory.py [--batch 1000] [--batches 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_bmv2 import configure_forgive, frames
from ptf_tests.harness import AUX_PORT, GRPC_PORT, namespace
from ptf_tests.targets import Bmv2Target, Endpoint, bmv2_cli

SEND_PPS = 2000
"""The pace of each batch: well under what BMv2 forwards with this program."""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def inner(pid: int, batch: int, batches: int) -> None:
    """Runs inside the namespace: configure, send the batches, print the RSS after each."""
    session = configure_forgive(f"127.0.0.1:{GRPC_PORT}")
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind(("pt1", 0))
    out = []
    try:
        time.sleep(1.0)
        for kind, frame in frames().items():
            before = rss_kib(pid)
            for _ in range(batches):
                for _ in range(batch):
                    tx.send(frame)
                    time.sleep(1 / SEND_PPS)
                time.sleep(1.0)
                out.append({"frame": kind, "rss_kib": rss_kib(pid), "before_kib": before})
                before = out[-1]["rss_kib"]
    finally:
        tx.close()
        session.close()
    print(json.dumps(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1000, help="frames per batch")
    parser.add_argument("--batches", type=int, default=3, help="batches per frame kind")
    parser.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args.inner, args.batch, args.batches)
        return 0
    if os.geteuid() != 0 or Bmv2Target.missing():
        print(f"bmv2_packet_memory: {Bmv2Target.missing() or 'needs root'}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="forgive-bmv2mem-") as tmp:
        netns = f"fgmem{os.getpid()}"
        with namespace(netns) as ports:
            ep = Endpoint(netns, ports, GRPC_PORT, AUX_PORT, Path(tmp))
            switch = Bmv2Target(ep, log_level="off")
            switch.start()
            try:
                for prio in (0, 1):
                    bmv2_cli(ep, f"set_queue_rate 1 2 {prio}")
                pid = switch._proc.pid
                cmd = ["ip", "netns", "exec", netns, sys.executable, "-m"]
                cmd += ["benchmarks.bmv2_packet_memory", "--inner", str(pid)]
                cmd += ["--batch", str(args.batch), "--batches", str(args.batches)]
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    print(f"bmv2_packet_memory: {done.stderr.strip()[-300:]}", file=sys.stderr)
                    return 1
                rows = json.loads(done.stdout)
            finally:
                switch.stop()
    print(f"{'frame':<22}{'RSS before KiB':>15}{'after KiB':>11}{'per packet B':>14}")
    for row in rows:
        per = (row["rss_kib"] - row["before_kib"]) * 1024 / args.batch
        print(f"{row['frame']:<22}{row['before_kib']:>15}{row['rss_kib']:>11}{per:>14.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
