"""The model and BMv2 given the same entries and the same packets send each packet out of the
same port with the same bytes: ECMP member choice (crc16), LPM and rewrites agree packet by
packet."""

from __future__ import annotations

import random

import pytest
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import Ether
from switch_harness import (
    NETNS,
    Bmv2Process,
    ModelProcess,
    VethSet,
    device_config,
    p4info,
)

from common.wire import FORGIVE_UDP_PORT
from controller import entries
from controller.client import SwitchClient
from controller.p4info import P4InfoIndex
from host_agent.scapy_layer import FTH

pytestmark = [
    *NETNS,
    pytest.mark.skipif(Bmv2Process.missing() is not None, reason=str(Bmv2Process.missing())),
]

MEMBERS = (2, 3, 4, 5)


def configure(grpc: str, device_id: int) -> SwitchClient:
    info = p4info()
    index = P4InfoIndex(info)
    client = SwitchClient("s", grpc, device_id)
    client.connect()
    client.set_pipeline(info, device_config(), 1)
    client.insert(
        [
            entries.ecmp_route(index, 0x0A090000, 16, 9, len(MEMBERS)),
            entries.route(index, 0x0A090100, 24, 0x020000000006, 6),
            *(
                entries.ecmp_member(index, 9, member, 0x020000000000 | port, port)
                for member, port in enumerate(MEMBERS)
            ),
        ]
    )
    return client


def packets() -> list[bytes]:
    rng = random.Random(5)
    out = []
    for i in range(80):
        dst = f"10.9.{rng.choice([0, 1, 7, 200])}.{rng.randrange(1, 255)}"
        src = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        head = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:aa") / IP(src=src, dst=dst, id=i)
        if i % 5 == 4:
            pkt = head / ICMP(id=i)
        else:
            sport, dport = rng.randrange(1024, 65536), rng.choice([FORGIVE_UDP_PORT, 4791, 53])
            body = (
                FTH(length=32, seq=0, aux=32) / bytes(32)
                if dport == FORGIVE_UDP_PORT
                else bytes(32)
            )
            pkt = head / UDP(sport=sport, dport=dport, chksum=0) / body
        out.append(bytes(pkt))
    return out


def egress(veths: VethSet, frames: list[bytes]) -> dict[int, tuple[int, bytes]]:
    """Packet number (IPv4 id) -> the port it left by and its bytes."""
    for pair in veths.pairs.values():
        pair.drain()
    seen = {}
    for frame in frames:
        veths.pairs[1].send(frame)
    for port in (*MEMBERS, 6):
        for out in veths.pairs[port].receive(timeout=0.7):
            seen[Ether(out)[IP].id] = (port, out)
    return seen


def test_model_and_bmv2_choose_the_same_port_for_every_packet(tmp_path):
    frames = packets()
    results = {}
    with VethSet(6) as veths:
        for name, switch in (
            ("model", ModelProcess(veths.interfaces(), workdir=tmp_path)),
            ("bmv2", Bmv2Process(veths.interfaces())),
        ):
            with switch:
                client = configure(switch.grpc, switch.device_id)
                try:
                    results[name] = egress(veths, frames)
                finally:
                    client.close()
    assert len(results["model"]) == len(frames)
    assert results["model"] == results["bmv2"]
    assert {port for port, _ in results["model"].values()} == {*MEMBERS, 6}
