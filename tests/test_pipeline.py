"""The model's pipeline without sockets: the parser reads what scapy writes, each action edits
the bytes forgive.p4 edits, and every refused frame is counted under its reason."""

from __future__ import annotations

import pytest
from p4.v1 import p4runtime_pb2
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import Ether
from switch_harness import p4info

from common.wire import FORGIVE_UDP_PORT, TRIMMED_FRAME_LEN, Flag, Opcode
from controller.p4info import P4InfoIndex
from host_agent.scapy_layer import FTH
from switch_model.counters import CounterArrays
from switch_model.pipeline import Pipeline
from switch_model.port import EgressPort
from switch_model.surface import load_pipeline
from switch_model.tables import TableStore

INDEX = P4InfoIndex(p4info())
PORTS = (2, 3)
DMAC = {2: 0x020000000002, 3: 0x020000000003, 9: 0x020000000009}


def rig(data_queue_bytes: int = 3 * 1500, kmin: int = 1 << 30, kmax: int = 1 << 30, pmax=0):
    """10.0.2.0/24 to port 2 (managed), 10.0.3.0/24 to port 3 (unmanaged), 10.0.9.0/24 to
    port 9 (no such port), 10.0.7.0/24 to an empty ECMP group, 10.0.8.0/24 to group 8 whose
    one member has no entry."""
    store = TableStore(load_pipeline(p4info()))
    entries = [
        INDEX.table_entry(
            "ForgiveIngress.ipv4_lpm",
            {"hdr.ipv4.dstAddr": (0x0A000000 | port << 8, 24)},
            "ForgiveIngress.set_nhop",
            {"dmac": DMAC[port], "port": port},
        )
        for port in (2, 3, 9)
    ]
    for group, members in ((7, 0), (8, 1)):
        entries.append(
            INDEX.table_entry(
                "ForgiveIngress.ipv4_lpm",
                {"hdr.ipv4.dstAddr": (0x0A000000 | group << 8, 24)},
                "ForgiveIngress.set_ecmp_group",
                {"group_id": group, "num_members": members},
            )
        )
    entries.append(
        INDEX.table_entry(
            "ForgiveIngress.port_thresholds",
            {"standard_metadata.egress_spec": 2},
            "ForgiveIngress.set_thresholds",
            {
                "data_queue_bytes": data_queue_bytes,
                "ecn_kmin": kmin,
                "ecn_kmax": kmax,
                "ecn_pmax": pmax,
            },
        )
    )
    for entry in entries:
        update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
        update.entity.table_entry.CopyFrom(entry)
        store.apply(update)
    pipeline = Pipeline({p: EgressPort(p) for p in PORTS}, CounterArrays(), seed=3)
    pipeline.forwarding = store.compile()
    return pipeline


def ip(dst="10.0.2.9", **fields):
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:aa") / IP(
        src="10.0.1.1", dst=dst, **fields
    )


def data(dst="10.0.2.9", payload=1000, tos=2, **ip_fields):
    return bytes(
        ip(dst, tos=tos, **ip_fields)
        / UDP(sport=50000, dport=FORGIVE_UDP_PORT, chksum=0)
        / FTH(opcode=Opcode.DATA, length=payload, flow_id=7, seq=0, aux=1 << 20)
        / bytes(payload)
    )


def plain_udp(dst="10.0.2.9", size=1500):
    head = ip(dst) / UDP(sport=4000, dport=5000)
    return bytes(head / bytes(size - len(head)))


@pytest.mark.parametrize(
    ("frame", "fields"),
    [
        (data(tos=0x2A), (0x2A, 64, 17, 0x0A000209, 50000, FORGIVE_UDP_PORT, True, False, False)),
        (
            bytes(
                ip(ttl=9) / UDP(sport=1, dport=FORGIVE_UDP_PORT) / FTH(opcode=Opcode.ACK, length=4)
            ),
            (0, 9, 17, 0x0A000209, 1, FORGIVE_UDP_PORT, False, True, False),
        ),
        (
            bytes(
                ip() / UDP(sport=1, dport=FORGIVE_UDP_PORT) / FTH(flags=int(Flag.TRIMMED), length=9)
            ),
            (0, 64, 17, 0x0A000209, 1, FORGIVE_UDP_PORT, False, True, False),
        ),
        (plain_udp(), (0, 64, 17, 0x0A000209, 4000, 5000, False, False, False)),
        (bytes(ip(dst="10.1.2.3") / ICMP()), (0, 64, 1, 0x0A010203, 0, 0, False, False, False)),
        (bytes(ip() / UDP(dport=FORGIVE_UDP_PORT) / (b"\x20" + bytes(15))), None),
    ],
    ids=["data", "ack", "trimmed", "udp", "icmp", "fth-version-2"],
)
def test_the_parser_reads_the_fields_scapy_wrote(frame, fields):
    hdr = Pipeline.parse(bytearray(frame))
    got = (
        hdr.tos,
        hdr.ttl,
        hdr.protocol,
        hdr.dst,
        hdr.l4_src_port,
        hdr.l4_dst_port,
        hdr.is_data,
        hdr.is_control,
        hdr.malformed,
    )
    if fields is None:
        assert hdr.malformed
    else:
        assert got == fields


def test_trim_and_mark_edit_the_bytes_as_the_program_does():
    pipeline = rig(data_queue_bytes=1500, kmin=0, kmax=0)
    first, second = data(payload=1000), data(payload=1000, id=2)
    assert pipeline.process(bytearray(first), 0.0) is pipeline.ports[2]
    assert pipeline.process(bytearray(second), 0.0) is pipeline.ports[2]
    (marked, _), (trimmed, received) = pipeline.ports[2].low[0], pipeline.ports[2].high[0]
    expect = Ether(first)
    expect.src, expect.dst, expect[IP].ttl, expect[IP].tos = expect.dst, "02:00:00:00:00:02", 63, 3
    del expect[IP].chksum
    assert bytes(marked) == bytes(Ether(bytes(expect)))
    cut = Ether(second)
    cut.src, cut.dst, cut[IP].ttl = cut.dst, "02:00:00:00:00:02", 63
    cut[FTH].flags = int(Flag.TRIMMED)
    cut[FTH].remove_payload()
    cut[IP].len, cut[UDP].len, cut[UDP].chksum = 44, 24, 0
    del cut[IP].chksum
    assert bytes(trimmed) == bytes(Ether(bytes(cut))) and len(trimmed) == TRIMMED_FRAME_LEN
    assert received == len(second), "counters count the frame as received"
    c = pipeline.counters
    assert (c.ce_marks[2], c.trims[2], c.drops[2]) == (1, 1, 0)


def test_every_refused_frame_is_counted_by_reason():
    pipeline = rig()
    refused = {
        "short frame": [b"\x02" * 13, bytes(ip())[:30]],
        "not IPv4": [bytes(Ether(type=0x86DD) / bytes(60))],
        "no route": [data(dst="10.9.9.9")],
        "empty ECMP group": [data(dst="10.0.7.1")],
        "TTL expired": [data(ttl=1)],
        "malformed": [bytes(ip() / UDP(dport=FORGIVE_UDP_PORT) / (b"\x20" + bytes(15)))],
        "no such port": [data(dst="10.0.9.1")],
    }
    for frames in refused.values():
        for frame in frames:
            assert pipeline.process(bytearray(frame), 0.0) is None
    # group 8's one member has no ecmp_nhop entry: the default, drop
    assert pipeline.process(bytearray(data(dst="10.0.8.1")), 0.0) is None
    assert pipeline.dropped == {reason: len(frames) for reason, frames in refused.items()} | {
        "no route": 2
    }
    assert pipeline.counters.drops[2] == 2, "only TTL expired and malformed had a port"


def test_non_fth_traffic_over_the_data_queue_is_dropped_and_counted_by_reason():
    pipeline = rig(data_queue_bytes=3 * 1500)
    queued = [pipeline.process(bytearray(plain_udp()), 0.0) for _ in range(5)]
    assert [q is not None for q in queued] == [True, True, True, False, False]
    assert pipeline.counters.drops[2] == 2 and pipeline.counters.trims[2] == 0
    assert pipeline.dropped == {"data queue full": 2}


def test_a_full_buffer_drops_and_counts_at_the_port():
    pipeline = rig()
    pipeline.ports[3].low_capacity = 2000
    assert pipeline.process(bytearray(plain_udp("10.0.3.1")), 0.0) is not None
    assert pipeline.process(bytearray(plain_udp("10.0.3.1")), 0.0) is None
    assert pipeline.dropped == {"buffer full": 1} and pipeline.counters.drops[3] == 1


def test_a_frame_the_wire_refuses_is_a_drop_not_a_transmission():
    pipeline = rig()
    pipeline.egress(2, 1500)
    pipeline.not_sent(2, 1500)
    c = pipeline.counters
    assert (c.tx_packets[2], c.tx_bytes[2], c.drops[2]) == (0, 0, 1)
    assert pipeline.dropped == {"send failed": 1}
