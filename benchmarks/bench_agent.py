"""Goodput of one agent-to-agent flow on a veth pair, against two references measured in the same run.

- raw ceiling: a bare Python AF_PACKET sender blasting the agent's own
  full-size DATA frames (prebuilt, no transport) and a bare receiver counting
  them; what Python on raw sockets can move with no protocol at all;
- kernel TCP: iperf3 over the same veth.

The agent's goodput is flow bytes over the sender's flow completion time (first
packet to last ACK). The agent paces at its configured line rate, and a rate
above what the receiving process can absorb fills its socket and turns into
timeouts, so the run tries a few line rates as fractions of the measured
ceiling and reports each. Those runs keep no payload at the receiver (like the
bare receiver); one more run at the best rate keeps it, as deliveries need.
`--compare DIR` runs another checkout's agent (e.g. `git worktree add /tmp/old
main`) right after each of this tree's, at the same line rate, so the two are
measured side by side in one run. Needs root: `make bench-agent`.
"""

from __future__ import annotations

import argparse
import json
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from netns import Lab, reap_stale  # noqa: E402

from common.frames import FrameBuilder, ip_bytes, mac_bytes  # noqa: E402
from common.wire import PACKET_BYTES, Dscp, Fth, Opcode  # noqa: E402
from host_agent.api import AgentClient  # noqa: E402
from host_agent.link import RawLink  # noqa: E402

FRAME_PAYLOAD = PACKET_BYTES
IDLE_S = 0.5


def raw_send(iface: str, src_ip: str, dst_ip: str, dst_mac: str, frames: int) -> None:
    link = RawLink(iface)
    body = Fth(Opcode.DATA, 0, FRAME_PAYLOAD, 1, 0, FRAME_PAYLOAD).encode(bytes(FRAME_PAYLOAD))
    headers = FrameBuilder(link.mac, ip_bytes(src_ip)).headers(
        mac_bytes(dst_mac), ip_bytes(dst_ip), Dscp.GRADIENT, 2, 50000, len(body)
    )
    send = link.send
    for _ in range(frames):
        send(headers, body)
    print(json.dumps({"tx_errors": link.tx_errors}))


def raw_recv(iface: str, frames: int) -> None:
    link = RawLink(iface)
    print("ready", flush=True)
    count = 0
    first = last = None
    while count < frames:
        ready, _, _ = select.select([link], [], [], IDLE_S if first else 30.0)
        if not ready:
            break
        batch = link.recv_batch(256)
        now = time.monotonic()
        if first is None:
            first = now
        for frame in batch:
            if len(frame) > FRAME_PAYLOAD:
                count += 1
        last = now
    elapsed = (last - first) if first and last and last > first else float("nan")
    print(json.dumps({"frames": count, "seconds": elapsed}))


SENDER_CPU, RECEIVER_CPU = "0", "1"
"""Every sender (raw, agent) on one core and every receiver on the other, so runs compare."""


def _subcommand(lab: Lab, ns: str, cpu: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, "taskset", "-c", cpu, sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
    )


def measure_raw(lab: Lab, a, b, frames: int) -> float:
    recv = _subcommand(lab, b.ns, RECEIVER_CPU, "raw-recv", b.iface, str(frames))
    assert recv.stdout is not None
    if recv.stdout.readline().strip() != "ready":
        raise RuntimeError("raw receiver did not start")
    send = _subcommand(lab, a.ns, SENDER_CPU, "raw-send", a.iface, a.ip, b.ip, b.mac, str(frames))
    send.communicate(timeout=120)
    out, _ = recv.communicate(timeout=120)
    result = json.loads(out.strip().splitlines()[-1])
    return result["frames"] * FRAME_PAYLOAD * 8 / result["seconds"]


def measure_tcp(lab: Lab, a, b, seconds: float) -> float:
    server = lab.spawn(b.ns, "iperf3", "-s", "-1", log="iperf3-server.log")
    time.sleep(0.5)
    out = lab.run(a.ns, "iperf3", "-c", b.ip, "-t", str(seconds), "-J")
    server.wait(timeout=30)
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"])


def measure_agent(
    lab: Lab,
    a,
    b,
    size: int,
    line_rate: float,
    tag: str,
    keep_payload: bool,
    root: Path = ROOT,
) -> tuple[float, dict]:
    clients = []
    for host in (a, b):
        extra = [] if keep_payload or host is a else ["--no-payload"]
        sock = lab.workdir / f"{tag}-{host.name}.sock"
        cpu = SENDER_CPU if host is a else RECEIVER_CPU
        agent = ["commands.agent", "--iface", host.iface, "--api", str(sock)]
        agent += ["--stats", str(lab.workdir / f"{tag}-{host.name}.jsonl")]
        agent += ["--line-rate", str(line_rate), "--policy", "dcqcn", *extra]
        lab.spawn(
            host.ns,
            *("env", f"PYTHONPATH={root}", "taskset", "-c", cpu, sys.executable, "-m"),
            *agent,
            log=f"{tag}-{host.name}.log",
        )
        clients.append(AgentClient(str(sock)))
    tx, rx = clients
    try:
        assert rx.call("register_flow", flow=1, step=0, traffic_class="other")["ok"]
        assert tx.call("send", bytes(size), dst=b.ip, flow=1, traffic_class="other")["ok"]
        event, _ = tx.wait_event(lambda e: e["event"] == "send_done", timeout=120)
    finally:
        for client in clients:
            client.close()
        for proc in lab.procs[-2:]:
            proc.terminate()
            proc.wait(timeout=10)
    summary = [
        json.loads(line)
        for line in (lab.workdir / f"{tag}-{b.name}.jsonl").read_text().splitlines()
        if '"agent"' in line
    ]
    event["receiver_socket_drops"] = summary[-1]["socket_drops"] if summary else None
    return size * 8 / event["duration"], event


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=120_000, help="raw-ceiling frames")
    parser.add_argument("--flow-mb", type=int, default=128, help="agent flow size, MiB")
    parser.add_argument("--tcp-seconds", type=float, default=4.0)
    parser.add_argument(
        "--compare", type=Path, help="another checkout whose agent runs beside this one's"
    )
    parser.add_argument(
        "--rate-fractions",
        default="1.0,1.5,2.0,3.0",
        help="agent line rates to try, as fractions of the raw ceiling",
    )
    args = parser.parse_args(argv)
    reap_stale()
    lab = Lab(Path(tempfile.mkdtemp(prefix="bench-agent-")))
    try:
        a, b = lab.pair()
        tcp = measure_tcp(lab, a, b, args.tcp_seconds)
        print(f"kernel TCP (iperf3): {tcp / 1e9:6.2f} Gbit/s")
        raws: list[float] = []
        trees = {"agent": ROOT, **({"compared": args.compare.resolve()} if args.compare else {})}
        paired: dict[str, list[float]] = {name: [] for name in trees}
        best = dict.fromkeys(trees, 0.0)
        best_fraction = 1.0
        runs = [(float(f), False) for f in args.rate_fractions.split(",")]
        for i, (fraction, keep) in enumerate(runs):
            # A raw measurement right before each agent run: the machine's load drifts.
            raw = measure_raw(lab, a, b, args.frames)
            raws.append(raw)
            for name, root in trees.items():
                goodput, event = measure_agent(
                    lab, a, b, args.flow_mb << 20, max(raws) * fraction, f"{name}{i}", keep, root
                )
                if not keep:
                    paired[name].append(goodput / raw)
                    if goodput > best[name]:
                        best[name] = goodput
                        if name == "agent":
                            best_fraction = fraction
                print(
                    f"raw {raw / 1e9:5.2f} Gbit/s | {name}, line rate {fraction:4.2f} x ceiling"
                    f"{', payload kept' if keep else ''}: {goodput / 1e9:5.2f} Gbit/s"
                    f" = {goodput / raw:5.1%} of the raw run before it"
                    f" (retransmitted {event['retransmitted_bytes']} B, RTOs {event['rtos']},"
                    f" receiver socket drops {event['receiver_socket_drops']})"
                )
            if i == len(runs) - 1 and not keep:
                runs.append((best_fraction, True))
        ceiling = max(raws)
        print(f"raw-socket ceiling (best of {len(raws)} runs): {ceiling / 1e9:.2f} Gbit/s")
        for name, root in trees.items():
            print(
                f"{name} ({root}): best / raw ceiling = {best[name] / ceiling:.2f}"
                f"   median paired / raw = {statistics.median(paired[name]):.2f}"
                f"   best / kernel TCP = {best[name] / tcp:.2f}   (target: >= 0.70 x raw)"
            )
    finally:
        lab.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "raw-send":
        raw_send(*sys.argv[2:6], int(sys.argv[6]))
    elif len(sys.argv) > 1 and sys.argv[1] == "raw-recv":
        raw_recv(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(main())
