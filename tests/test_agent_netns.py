"""Host agents as real processes in network namespaces, over raw sockets on veths."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns import Host, Lab, mac_of, netns_unavailable

from host_agent.api import AgentClient
from workload.plan import Kind, kind_of

_UNAVAILABLE = netns_unavailable()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or ""),
]
RELAY = str(Path(__file__).with_name("relay.py"))
EVENT_TIMEOUT = 20.0


def start_agent(lab: Lab, host: Host, *extra: str) -> AgentClient:
    sock = lab.workdir / f"{host.name}.sock"
    lab.python(
        host.ns,
        "commands.agent",
        "--iface",
        host.iface,
        "--api",
        str(sock),
        "--stats",
        str(lab.workdir / f"{host.name}.jsonl"),
        *extra,
        log=f"{host.name}.log",
    )
    return AgentClient(str(sock))


def ok(reply: dict) -> dict:
    assert reply["ok"], reply
    return reply


def done(client: AgentClient, kind: str, flow: int):
    return client.wait_event(
        lambda e: e["event"] == kind and e["flow"] == flow, timeout=EVENT_TIMEOUT
    )


def records(lab: Lab, name: str) -> list[dict]:
    return [json.loads(line) for line in lab.log(name).splitlines() if line.strip()]


def test_pair_delivers_every_byte_both_ways(lab):
    a, b = lab.pair()
    clients = {a.name: start_agent(lab, a), b.name: start_agent(lab, b)}
    rng = random.Random(1)
    sizes = [1, 4095, 4096, 4097, 300_000]
    classes = ["tensor-parallel", "pipeline-parallel", "other", "gradient", "tensor-parallel"]
    flows = []
    for src, dst in ((a, b), (b, a)):
        rx = clients[dst.name]
        ok(rx.call("begin_step", step=1, critical=False, expected_gradient_bytes=4096))
        for i, (size, cls) in enumerate(zip(sizes, classes, strict=True)):
            flow = (1 if src is a else 2) << 8 | i
            ok(rx.call("register_flow", flow=flow, step=1, traffic_class=cls, deliver=True))
            flows.append((src, dst, flow, rng.randbytes(size), cls))
    for src, dst, flow, data, cls in flows:
        ok(clients[src.name].call("send", data, dst=dst.ip, flow=flow, traffic_class=cls, step=1))
    for src, dst, flow, data, _ in flows:
        event, payload = done(clients[dst.name], "recv_done", flow)
        assert payload == data, f"flow {flow}: content differs"
        assert event["received_bytes"] == len(data) and event["forgiven_bytes"] == 0
        sent, _ = done(clients[src.name], "send_done", flow)
        assert sent["acked_bytes"] == len(data)
    for client in clients.values():
        stats = ok(client.call("stats"))
        assert stats["counters"].get("bound_violations", 0) == 0
        assert stats["core_rx"]["unknown_flow"] == 0


def test_frames_on_the_wire_carry_class_ecn_and_path_entropy(lab):
    """Captured by tcpdump and read by scapy, independently of the agent's own parser."""
    pytest.importorskip("scapy")
    from scapy.error import Scapy_Exception
    from scapy.layers.inet import IP, UDP
    from scapy.utils import rdpcap

    from host_agent.scapy_layer import FTH

    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump is not installed")
    a, b = lab.pair()
    pcap = lab.workdir / "a.pcap"
    dump = lab.spawn(
        a.ns,
        "tcpdump",
        "-i",
        a.iface,
        "--immediate-mode",
        "-U",
        "-w",
        str(pcap),
        "udp",
        log="tcpdump.log",
    )
    deadline = time.monotonic() + 10
    while "listening on" not in lab.log("tcpdump.log") and time.monotonic() < deadline:
        time.sleep(0.05)
    slow = ("--line-rate", "2e8")  # so that tcpdump sees every frame of a busy machine
    spraying, steady = start_agent(lab, a, *slow), start_agent(lab, b, "--no-spray", *slow)
    ok(steady.call("begin_step", step=1, critical=False, expected_gradient_bytes=100_000))
    ok(steady.call("register_flow", flow=1, step=1, traffic_class="gradient"))
    ok(spraying.call("register_flow", flow=2, step=1, traffic_class="pipeline-parallel"))
    ok(spraying.call("send", bytes(100_000), dst=b.ip, flow=1, traffic_class="gradient", step=1))
    ok(steady.call("send", bytes(100_000), dst=a.ip, flow=2, traffic_class="pipeline-parallel"))
    done(spraying, "send_done", 1)
    done(steady, "send_done", 2)

    def captured() -> dict[int, list]:
        """tcpdump writes as it reads its ring; a busy machine leaves it behind the wire."""
        data: dict[int, list] = {1: [], 2: []}
        with contextlib.suppress(Scapy_Exception, EOFError, struct.error):
            for p in rdpcap(str(pcap)):
                if FTH in p and p[FTH].opcode == 0:
                    data[p[FTH].flow_id].append(p)
        return data

    deadline = time.monotonic() + EVENT_TIMEOUT
    while min(map(len, captured().values())) < 25 and time.monotonic() < deadline:
        time.sleep(0.1)
    dump.terminate()
    dump.wait(timeout=10)
    packets = [p for p in rdpcap(str(pcap)) if FTH in p]
    data = {1: [], 2: []}
    for p in packets:
        assert p[UDP].chksum == 0
        if p[FTH].opcode == 0:
            data[p[FTH].flow_id].append(p)
        else:
            assert p[IP].tos == 48 << 2, "ACK/NACK/CNP travel as DSCP 48, not ECN-capable"
    assert len(data[1]) >= 25 and len(data[2]) >= 25, lab.log("tcpdump.log")
    assert all(p[IP].tos == (10 << 2) | 2 for p in data[1]), "gradient: DSCP 10, ECT(0)"
    assert all(p[IP].tos == (20 << 2) | 2 for p in data[2]), "pipeline: DSCP 20, ECT(0)"
    assert len({p[UDP].sport for p in data[1]}) > len(data[1]) // 2, "spraying varies the port"
    assert len({p[UDP].sport for p in data[2]}) == 1, "without spraying one port per flow"
    assert max(len(p) for p in data[1]) == 14 + 20 + 8 + 16 + 4096


def test_an_interface_with_a_small_mtu_is_refused(lab):
    a, _ = lab.pair()
    lab.run(a.ns, "ip", "link", "set", a.iface, "mtu", "1500")
    agent = [
        sys.executable,
        "-m",
        "commands.agent",
        "--iface",
        a.iface,
        "--api",
        str(lab.workdir / "s"),
    ]
    result = subprocess.run(
        ["ip", "netns", "exec", a.ns, *agent],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"forgive-agent: interface '{a.iface}' has MTU 1500; full DATA packets need 4140 (use 9000)"
    )


def test_an_unread_api_client_does_not_stall_the_agent(lab):
    a, b = lab.pair()
    rx, tx = start_agent(lab, a), start_agent(lab, b)
    flows = {f: random.Random(f).randbytes(1_000_000) for f in (1, 2, 3)}
    for flow in flows:
        ok(rx.call("register_flow", flow=flow, step=0, traffic_class="other", deliver=True))
    for flow, data in flows.items():
        ok(tx.call("send", data, dst=a.ip, flow=flow, traffic_class="other"))
    # Nobody reads rx's deliveries (3 MB, far beyond a socket buffer) while b's flows
    # need rx's agent to keep acknowledging.
    for flow in flows:
        tx.wait_event(lambda e, f=flow: e["event"] == "send_done" and e["flow"] == f, timeout=3)
    for flow, data in flows.items():
        assert done(rx, "recv_done", flow)[1] == data


INJECT = r"""
import socket, sys
from common.frames import FrameBuilder, mac_bytes, ip_bytes
from common.wire import Fth, Opcode
iface, src_ip, dst_ip, dst_mac = sys.argv[1:5]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
b = FrameBuilder(s.getsockname()[4], ip_bytes(src_ip))
def send(body, dscp=10, mangle=None):
    frame = bytearray(b.headers(mac_bytes(dst_mac), ip_bytes(dst_ip), dscp, 2, 40000, len(body)) + body)
    if mangle:
        mangle(frame)
    s.send(bytes(frame))
data = Fth(Opcode.DATA, 0, 100, 77, 0, 100).encode(bytes(100))
send(b"\x10\x00")                                       # FTH cut short
send(b"\x20" + data[1:])                                # FTH version 2
send(data[:-1])                                         # payload shorter than the header says
send(data + b"x")                                       # payload longer than the header says
send(Fth(Opcode.DATA, 0, 100, 999, 0, 100).encode(bytes(100)))   # a flow nobody registered
send(Fth(Opcode.ACK, 0, 100, 999, 100, 0).encode(), dscp=48)     # an ACK for no flow
send(bytes(range(256)) * 4)                             # noise
send(data, mangle=lambda f: f.__setitem__(25, f[25] ^ 0xFF))       # IPv4 checksum broken
send(data, mangle=lambda f: f.__setitem__(39, f[39] ^ 0x01))       # UDP length disagrees
send(data, mangle=lambda f: f.__setitem__(slice(16, 18), (9000).to_bytes(2, "big")))  # IPv4 length past the frame
"""


def test_agent_survives_malformed_frames_and_an_unknown_flow(lab):
    a, b = lab.pair()
    rx = start_agent(lab, b)
    tx = start_agent(lab, a)
    ok(rx.call("begin_step", step=1, critical=False, expected_gradient_bytes=0))
    ok(rx.call("register_flow", flow=77, step=1, traffic_class="other", deliver=True))
    lab.run(a.ns, sys.executable, "-c", INJECT, a.iface, a.ip, b.ip, b.mac)
    expected = {"frames": 4, "rx_malformed": 4, "rx_unknown": 1, "tx_unknown": 1}
    deadline = time.monotonic() + EVENT_TIMEOUT
    while True:
        stats = ok(rx.call("stats"))
        seen = {
            "frames": stats["counters"].get("malformed_frames", 0),
            "rx_malformed": stats["core_rx"]["malformed"],
            "rx_unknown": stats["core_rx"]["unknown_flow"],
            "tx_unknown": stats["core_tx"]["unknown_flow"],
        }
        if seen == expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert seen == expected
    # Nothing above touched flow 77's state: the real flow still arrives whole.
    data = random.Random(2).randbytes(50_000)
    ok(tx.call("send", data, dst=b.ip, flow=77, traffic_class="other"))
    _, payload = done(rx, "recv_done", 77)
    assert payload == data
    assert "Traceback" not in lab.log("b.log")


def relay_pair(lab: Lab, n: int, *relay_args: str) -> tuple[list[Host], dict[str, str]]:
    """`n` hosts around the damaging relay; returns them and each host's gateway MAC."""
    hosts, hub = lab.star(n, "relay")
    gateways = {h.name: mac_of(lab, hub, f"p{i}") for i, h in enumerate(hosts)}
    ports = [f"p{i}={h.ip}={h.mac}" for i, h in enumerate(hosts)]
    lab.spawn(
        hub,
        sys.executable,
        RELAY,
        *ports,
        "--stats",
        str(lab.workdir / "relay.json"),
        *relay_args,
        log="relay.log",
    )
    return hosts, gateways


def test_relay_trims_and_drops_are_retransmitted_or_forgiven(lab):
    (a, b), gw = relay_pair(lab, 2, "--trim-every", "5", "--drop-every", "23", "--ce-every", "7")
    tx = start_agent(lab, a, "--gateway-mac", gw["a"])
    rx = start_agent(lab, b, "--gateway-mac", gw["b"])
    rng = random.Random(3)
    grad = rng.randbytes(400_000)
    tp = rng.randbytes(200_000)
    ok(rx.call("begin_step", step=4, critical=False, expected_gradient_bytes=len(grad)))
    ok(rx.call("register_flow", flow=1, step=4, traffic_class="gradient", deliver=True))
    ok(rx.call("register_flow", flow=2, step=4, traffic_class="tensor-parallel", deliver=True))
    ok(tx.call("send", grad, dst=b.ip, flow=1, traffic_class="gradient", step=4))
    ok(tx.call("send", tp, dst=b.ip, flow=2, traffic_class="tensor-parallel", step=4))

    tp_event, tp_payload = done(rx, "recv_done", 2)
    assert tp_payload == tp and tp_event["forgiven_bytes"] == 0 and tp_event["trims"] > 0
    grad_event, grad_payload = done(rx, "recv_done", 1)
    forgiven = grad_event["forgiven_bytes"]
    assert forgiven > 0 and grad_event["trims"] > 0
    assert grad_event["received_bytes"] + forgiven == len(grad)
    differ = [i for i, (x, y) in enumerate(zip(grad_payload, grad, strict=True)) if x != y]
    assert len(differ) <= forgiven and all(grad_payload[i] == 0 for i in differ)
    assert grad_event["ce_marks"] > 0 and grad_event["cnps_sent"] > 0

    sends = [done(tx, "send_done", f)[0] for f in (1, 2)]
    assert sends[1]["retransmitted_bytes"] > 0 and sends[1]["nacks"] > 0
    assert sum(s["rtos"] for s in sends) > 0, "a dropped frame must be recovered by timeout"

    state = ok(rx.call("step_state", step=4))["state"]
    p = state["p"]
    assert state["forgiven"] == forgiven <= state["budget"]
    assert state["forgiven"] * (1 - p) <= p * state["received"]
    ok(rx.call("complete_step", step=4))
    assert ok(rx.call("stats"))["counters"].get("bound_violations", 0) == 0
    lab.close()
    relay = json.loads((lab.workdir / "relay.json").read_text())
    assert relay["trimmed"] > 0 and relay["dropped"] > 0
    steps = [r for r in records(lab, "b.jsonl") if r["type"] == "step"]
    assert steps[0]["forgiven"] == steps[0]["rx_forgiven_bytes"] == forgiven
    assert steps[0]["rx_trims"] == grad_event["trims"] + tp_event["trims"]


def test_three_agents_resolve_each_other_by_arp(lab):
    hosts = lab.bridge(3)
    clients = {h.name: start_agent(lab, h, "--no-spray") for h in hosts}
    payloads = {}
    for i, src in enumerate(hosts):
        for j, dst in enumerate(hosts):
            if i == j:
                continue
            flow = 16 * i + j
            data = random.Random(flow).randbytes(20_000 + flow)
            payloads[(src.name, dst.name, flow)] = data
            rx = clients[dst.name]
            ok(rx.call("register_flow", flow=flow, step=0, traffic_class="other", deliver=True))
    for (src, dst, flow), data in payloads.items():
        ip = next(h.ip for h in hosts if h.name == dst)
        ok(clients[src].call("send", data, dst=ip, flow=flow, traffic_class="other"))
    for (src, dst, flow), data in payloads.items():
        _, payload = done(clients[dst], "recv_done", flow)
        assert payload == data
        done(clients[src], "send_done", flow)


def train(lab: Lab, hosts, gw, policy: str, *args: str) -> list[dict]:
    ranks = ",".join(h.ip for h in hosts)
    procs = []
    for i, h in enumerate(hosts):
        procs.append(
            lab.python(
                h.ns,
                "commands.train",
                "--iface",
                h.iface,
                "--gateway-mac",
                gw[h.name],
                "--ranks",
                ranks,
                "--rank",
                str(i),
                "--policy",
                policy,
                "--out",
                str(lab.workdir / f"train{i}.jsonl"),
                "--stats",
                str(lab.workdir / f"agent{i}.jsonl"),
                "--timeout",
                "60",
                *args,
                log=f"train{i}.log",
            )
        )
    for i, proc in enumerate(procs):
        try:
            code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"rank {i} exited {code}: {lab.log(f'train{i}.log')[-2000:]}"
    return [r for i in range(len(hosts)) for r in records(lab, f"train{i}.jsonl")]


WORKLOAD = ("--steps", "6", "--grad-bytes", "600000", "--compute-ms", "2")
WORKLOAD += ("--tp-bytes", "50000", "--pp-bytes", "30000")


def test_workload_forgives_only_gradients_within_the_bound(lab):
    hosts, gw = relay_pair(lab, 3, "--trim-every", "6", "--ce-every", "9")
    burst = ("--burst-step", "5", "--burst-bytes", "300000", "--burst-src", "2", "--burst-dst", "0")
    out = train(lab, hosts, gw, "forgive", *WORKLOAD, *burst)
    steps = [r for r in out if r["type"] == "train_step"]
    final = [r for r in out if r["type"] == "train_done"]
    assert len(steps) == 3 * 6 and len(final) == 3
    assert not [r for r in out if r["type"] == "content_error"]
    assert all(r["content_errors"] == 0 and r["bound_violations"] == 0 for r in final)
    assert [s["critical"] for s in steps if s["rank"] == 0] == [
        True,
        True,
        True,
        False,
        False,
        True,
    ]
    for s in steps:
        assert s["bound_held"] and s["grad_forgiven"] <= s["grad_budget"]
        assert s["grad_received"] + s["grad_forgiven"] == s["grad_expected"]
        assert s["grad_forgiven"] * (1 - s["p"]) <= s["p"] * s["grad_received"]
    assert sum(s["grad_forgiven"] for s in steps if not s["critical"]) > 0
    sends = agent_records(lab, 3, "flow_send")
    assert any(r["mode_changes"] for r in sends), "eligible senders must turn exempt"
    assert all(r["mode_changes"] == 0 for r in sends if kind_of(r["flow"]) != Kind.GRADIENT)


def agent_records(lab: Lab, n: int, kind: str) -> list[dict]:
    return [r for i in range(n) for r in records(lab, f"agent{i}.jsonl") if r["type"] == kind]


@pytest.mark.parametrize("policy", ["dcqcn", "forgive-no-exemption"])
def test_workload_policies_without_exemption(lab, policy):
    """dcqcn forgives nothing; forgive-no-exemption forgives but never lets a sender go exempt."""
    hosts, gw = relay_pair(lab, 3, "--trim-every", "6")
    out = train(lab, hosts, gw, policy, *WORKLOAD)
    steps = [r for r in out if r["type"] == "train_step"]
    assert len(steps) == 3 * 6
    forgiven = sum(s["grad_forgiven"] for s in steps)
    assert (forgiven == 0) if policy == "dcqcn" else (forgiven > 0)
    sends = agent_records(lab, 3, "flow_send")
    assert sends and all(r["cc_mode"] == "obeying" and r["mode_changes"] == 0 for r in sends)
    assert all(r["exemption_eligible"] is False for r in agent_records(lab, 3, "flow_recv"))


def test_shedding_sender_and_receiver_agree(lab):
    hosts, gw = relay_pair(lab, 3)
    out = train(lab, hosts, gw, "loose", *WORKLOAD, "--seed", "5")
    final = [r for r in out if r["type"] == "train_done"]
    assert len(final) == 3
    shed_received = sum(r["grad_shed"] for r in final)
    shed_sent = sum(r["grad_shed_sent"] for r in final)
    assert shed_received == shed_sent > 0
    assert all(r["grad_forgiven"] == 0 for r in final)


def test_a_flow_to_a_silent_peer_fails_visibly(lab):
    """No agent answers at b: the API reports the flow failed, and forgive-train exits 1 in one line."""
    a, b = lab.pair()
    fast = ("--rto", "0.005", "--rto-max", "0.01", "--max-timeouts", "3")
    tx = start_agent(lab, a, *fast)
    ok(tx.call("send", bytes(50_000), dst=b.ip, flow=5, traffic_class="other"))
    event, _ = done(tx, "flow_failed", 5)
    assert event["dst"] == b.ip and event["acked_bytes"] == 0 and event["rtos"] >= 3
    assert ok(tx.call("stats"))["counters"]["flows_failed"] == 1
    assert [r["flow"] for r in records(lab, "a.jsonl") if r["type"] == "flow_failed"] == [5]
    trainer = [sys.executable, "-m", "commands.train", "--iface", a.iface, *fast]
    trainer += ["--ranks", f"{a.ip},{b.ip}", "--rank", "0", "--stats", "-", "--out", "-"]
    result = subprocess.run(
        ["ip", "netns", "exec", a.ns, *trainer], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("forgive-train: rank 0: flow ") and f"to {b.ip} failed: 3 " in line


FUZZ = r"""
import random, socket, sys, time
from common.frames import FrameBuilder, mac_bytes, ip_bytes
from common.wire import Flag, Fth, Opcode, PACKET_BYTES
iface, src_ip, dst_ip, dst_mac, count, seed, real_flow = sys.argv[1:8]
rng = random.Random(int(seed))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
b = FrameBuilder(s.getsockname()[4], ip_bytes(src_ip))
flows = [int(real_flow)] + [rng.randrange(1 << 32) for _ in range(7)]
for i in range(int(count)):
    flow = rng.choice(flows)
    total = rng.randrange(1, 1 << 32)
    length = rng.randrange(1, PACKET_BYTES + 1)
    seq = rng.randrange((1 << 32) - length)
    trimmed = rng.random() < 0.3
    fth = Fth(Opcode.DATA, Flag.TRIMMED if trimmed else 0, length, flow, seq, total)
    body = fth.encode(b"" if trimmed else rng.randbytes(length))
    s.send(b.headers(mac_bytes(dst_mac), ip_bytes(dst_ip), 10, 2, 40000 + i % 1000, len(body)) + body)
    if i % 50 == 49:
        time.sleep(0.002)   # paced, so the kernel's socket buffer never drops one
"""
FUZZ_FRAMES = 6000
RSS_GROWTH_LIMIT = 48 << 20
"""The receiving agent's resident memory may grow by this much while it is fuzzed: the
valid flow holds 4 MiB, the fuzzed packets claim up to 4 GiB each and must cost nothing."""


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_fuzzed_receive_path_holds_memory_and_counts_every_rejection(lab):
    """Well-formed FTH DATA and trimmed headers over random flows, sequence numbers and
    totals (the registered flow's id among them) while that flow runs beside them."""
    a, b = lab.pair()
    rx = start_agent(lab, b)
    tx = start_agent(lab, a)
    rx_pid = lab.procs[0].pid
    data = random.Random(5).randbytes(4 << 20)
    ok(rx.call("begin_step", step=1, critical=False, expected_gradient_bytes=len(data)))
    ok(
        rx.call(
            "register_flow", flow=77, step=1, traffic_class="gradient", deliver=True, size=len(data)
        )
    )
    before = _rss(rx_pid)
    fuzz = lab.spawn(
        a.ns,
        sys.executable,
        "-c",
        FUZZ,
        a.iface,
        a.ip,
        b.ip,
        b.mac,
        str(FUZZ_FRAMES),
        "9",
        "77",
        log="fuzz.log",
    )
    ok(tx.call("send", data, dst=b.ip, flow=77, traffic_class="gradient", step=1))
    _, payload = done(rx, "recv_done", 77)
    assert fuzz.wait(timeout=60) == 0, lab.log("fuzz.log")
    assert payload == data
    deadline = time.monotonic() + EVENT_TIMEOUT
    while True:
        stats = ok(rx.call("stats"))
        rejected = sum(stats["rx_rejected"].values())
        if rejected >= FUZZ_FRAMES or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rejected == FUZZ_FRAMES, stats["rx_rejected"]
    assert set(stats["rx_rejected"]) <= {"unknown_flow", "total_mismatch", "out_of_range"}
    assert stats["rx_rejected"]["unknown_flow"] > 0 and stats["rx_rejected"]["total_mismatch"] > 0
    assert _rss(rx_pid) - before < RSS_GROWTH_LIMIT
    assert "Traceback" not in lab.log("b.log")
