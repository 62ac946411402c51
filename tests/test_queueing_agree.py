"""The model and BMv2 queue alike: the same incast through each trims, marks and drops the same.

Three senders offer one egress port 1.5 times its line rate for a few seconds
on a fixed schedule (open loop, Poisson arrivals drawn from fixed seeds, so both targets see the same
load): one sends
FTH DATA (which a full data queue trims), one plain UDP (which it drops), one
a trickle of ACKs (which go high). The port is shaped the way the controller shapes every
fabric port (`controller.shaping.apply_shaping`), with the emulation's line
rate and thresholds, so this checks the configuration `forgive compare` runs.
Every frame is a full 4154 bytes except the 58-byte ACKs: BMv2 paces a queue in
packets, and only frames of the size it is paced in drain at the line rate in
bytes (docs/dataplane.md).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import socket
import time

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from switch_harness import (
    NETNS,
    Bmv2Process,
    ModelProcess,
    VethSet,
    device_config,
    p4info,
)

from common.wire import ECN_ECT0, FORGIVE_UDP_PORT, PACKET_BYTES, Opcode
from controller import entries
from controller.client import SwitchClient
from controller.p4info import P4InfoIndex
from controller.shaping import apply_shaping
from controller.topology import PortSpec, SwitchSpec
from host_agent.scapy_layer import FTH
from switch_model.surface import PMAX_ONE, Thresholds

pytestmark = NETNS

LINE_BPS = 20_000_000
"""The emulation's default host link."""
FRAME = 4154
DATA_QUEUE = 16 * FRAME
"""About the emulation's 64 KiB; ECN from 0.19 of it to 0.76, at most 0.2 below that."""
THRESHOLDS = Thresholds(DATA_QUEUE, 3 * FRAME, 12 * FRAME, round(0.2 * PMAX_ONE))
SECONDS = 5.0
EGRESS = 4
STREAMS = (  # port, share of the line rate, kind
    (1, 0.75, "data"),
    (2, 0.75, "udp"),
)
"""As many plain UDP frames as DATA, so that drops are about as many as trims: which of the
two finds the queue full can be a matter of microseconds, and only large counts agree closely."""
ACKS_PER_S = 100
TOLERANCE = 0.10


def frame(kind: str, port: int) -> bytes:
    head = Ether(src=f"02:00:00:00:00:0{port}", dst="02:00:00:00:00:aa") / IP(
        src=f"10.0.{port}.1", dst="10.0.4.1", tos=ECN_ECT0
    )
    if kind == "data":
        fth = FTH(opcode=Opcode.DATA, length=PACKET_BYTES, flow_id=port, seq=0, aux=1 << 30)
        out = head / UDP(sport=49152, dport=FORGIVE_UDP_PORT, chksum=0) / fth
        return bytes(out / bytes(PACKET_BYTES))
    if kind == "ack":
        fth = FTH(opcode=Opcode.ACK, length=PACKET_BYTES, flow_id=port, seq=0, aux=0)
        return bytes(head / UDP(sport=49152, dport=FORGIVE_UDP_PORT, chksum=0) / fth)
    udp = head / UDP(sport=40000, dport=5000)
    return bytes(udp / bytes(FRAME - len(udp)))


def arrivals(port: int, rate: float) -> list[float]:
    """Poisson arrivals at `rate` per second over the incast, the same on every run."""
    draw = random.Random(port)
    times, t = [], draw.expovariate(rate)
    while t < SECONDS:
        times.append(t)
        t += draw.expovariate(rate)
    return times


def schedule() -> list[tuple[float, int, bytes]]:
    """(time, port, frame) for the whole incast, in time order."""
    out = []
    for port, share, kind in STREAMS:
        data = frame(kind, port)
        out += [(t, port, data) for t in arrivals(port, share * LINE_BPS / (8 * FRAME))]
    ack = frame("ack", 3)
    out += [(t, 3, ack) for t in arrivals(3, ACKS_PER_S)]
    return sorted(out, key=lambda item: item[0])


def _send(interfaces: dict[int, str], plan, report) -> None:
    """Child process: send `plan` on time (real-time priority where allowed)."""
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    socks = {}
    for port, ifname in interfaces.items():
        socks[port] = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        socks[port].bind((ifname, 0))
    late = 0.0
    start = time.monotonic() + 0.05
    for at, port, data in plan:
        wait = start + at - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        else:
            late = max(late, -wait)
        socks[port].send(data)
    report.send((len(plan), late))


def counters(client: SwitchClient, port: int) -> dict[str, int]:
    (row,) = entries.read_port_counters(client, P4InfoIndex(p4info()), [port]).values()
    return {key: getattr(row, key) for key in ("tx_packets", "trims", "ce_marks", "drops")}


def configure(client: SwitchClient) -> None:
    info = p4info()
    index = P4InfoIndex(info)
    client.set_pipeline(info, device_config(), 1)
    client.insert(
        [
            entries.route(index, 0x0A000400, 24, 0x020000000004, EGRESS),
            entries.port_thresholds(index, EGRESS, THRESHOLDS),
        ]
    )


def incast(target: str, workdir) -> dict[str, int]:
    """Run the incast through a fresh switch of `target`; its egress port's counters."""
    plan = schedule()
    with VethSet(EGRESS) as veths:
        if target == "model":
            switch = ModelProcess(veths.interfaces(), workdir=workdir)
        else:
            switch = Bmv2Process(veths.interfaces())
        with switch:
            client = SwitchClient(target, switch.grpc, switch.device_id)
            client.connect()
            try:
                configure(client)
                spec = SwitchSpec(
                    target,
                    target,
                    switch.grpc,
                    switch.device_id,
                    control=getattr(switch, "control", None),
                    thrift_port=getattr(switch, "thrift_port", None),
                )
                port = PortSpec(THRESHOLDS, LINE_BPS, 2 * DATA_QUEUE, DATA_QUEUE)
                apply_shaping(spec, {EGRESS: port})
                ends = {p: veths.pairs[p].test_end for p in (1, 2, 3)}
                receive, report = multiprocessing.get_context("fork").Pipe(duplex=False)
                sender = multiprocessing.get_context("fork").Process(
                    target=_send, args=(ends, plan, report)
                )
                sender.start()
                sender.join(SECONDS + 30)
                sent, late = receive.recv()
                assert sent == len(plan)
                assert late < 0.05, f"the sender fell {late * 1e3:.0f} ms behind its schedule"
                time.sleep(1.0)  # the queue drains
                return counters(client, EGRESS)
            finally:
                client.close()


RESULTS: dict[str, dict[str, int]] = {}


def result(target: str, tmp_path_factory) -> dict[str, int]:
    if target not in RESULTS:
        RESULTS[target] = incast(target, tmp_path_factory.mktemp(target))
    return RESULTS[target]


@pytest.mark.parametrize("target", ["model", "bmv2"])
def test_an_incast_is_cut_to_the_line_rate(target, tmp_path_factory):
    """What the data queue admits leaves at the line rate: over the incast, the port sends
    about its line rate's worth of data frames, and trims or drops the rest."""
    if target == "bmv2" and Bmv2Process.missing():
        pytest.skip(f"bmv2: {Bmv2Process.missing()}")
    got = result(target, tmp_path_factory)
    plan = schedule()
    low = sum(1 for _, _, f in plan if len(f) == FRAME)
    admitted = low - got["trims"] - got["drops"]
    line_frames = SECONDS * LINE_BPS / (8 * FRAME) + DATA_QUEUE / FRAME
    assert abs(admitted - line_frames) <= TOLERANCE * line_frames, (got, admitted, line_frames)
    assert got["tx_packets"] == len(plan) - got["drops"]
    assert got["trims"] > 0 and got["drops"] > 0 and got["ce_marks"] > 0


def test_model_and_bmv2_trim_mark_and_drop_alike(tmp_path_factory):
    if Bmv2Process.missing():
        pytest.skip(f"bmv2: {Bmv2Process.missing()}")
    model = result("model", tmp_path_factory)
    bmv2 = result("bmv2", tmp_path_factory)
    print(f"incast at {LINE_BPS / 1e6:g} Mbit/s: model {model}, BMv2 {bmv2}")
    for key in ("trims", "ce_marks", "drops"):
        assert abs(model[key] - bmv2[key]) <= TOLERANCE * max(model[key], bmv2[key]), (
            f"{key}: model {model}, BMv2 {bmv2}"
        )
