"""Properties of the model's pipeline without sockets: LPM, and no frame ever raises."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st
from p4.v1 import p4runtime_pb2
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from switch_harness import p4info

from common import p4names
from common.wire import FORGIVE_UDP_PORT
from controller.p4info import P4InfoIndex
from host_agent.scapy_layer import FTH
from switch_model.counters import CounterArrays
from switch_model.pipeline import Pipeline
from switch_model.port import EgressPort
from switch_model.surface import load_pipeline
from switch_model.tables import Drop, TableStore

INFO = p4info()
INDEX = P4InfoIndex(INFO)


def insert(store: TableStore, entry: p4runtime_pb2.TableEntry, kind=p4runtime_pb2.Update.INSERT):
    update = p4runtime_pb2.Update(type=kind)
    update.entity.table_entry.CopyFrom(entry)
    store.apply(update)


def nhop(match: dict, port: int) -> p4runtime_pb2.TableEntry:
    return INDEX.table_entry(
        p4names.LPM_TABLE,
        match,
        p4names.SET_NHOP,
        {"dmac": 0x02_00_00_00_00_00 | port, "port": port},
    )


prefixes = st.lists(
    st.tuples(st.integers(0, 2**32 - 1), st.integers(1, 32)), min_size=1, max_size=30
).map(lambda ps: {(v & ~((1 << (32 - n)) - 1) & 0xFFFFFFFF, n) for v, n in ps})


@given(prefixes=prefixes, probes=st.lists(st.integers(0, 2**32 - 1), max_size=50))
def test_lpm_picks_the_longest_matching_prefix(prefixes, probes):
    store = TableStore(load_pipeline(INFO))
    ports = {}
    for i, (value, plen) in enumerate(sorted(prefixes)):
        ports[value, plen] = i % 511 + 1
        insert(store, nhop({"hdr.ipv4.dstAddr": (value, plen)}, ports[value, plen]))
    fwd = store.compile()
    for value, _ in prefixes:
        probes.append(value)
    for address in probes:
        matches = [
            key
            for key in prefixes
            if ipaddress.IPv4Address(address) in ipaddress.IPv4Network(key, strict=False)
        ]
        route = fwd.ipv4_lpm(address)
        if matches:
            assert route.port == ports[max(matches, key=lambda key: key[1])]
        else:
            assert isinstance(route, Drop)


def routed_pipeline() -> Pipeline:
    """Everything routed to port 1 (a default action), port 1 managed with small thresholds."""
    store = TableStore(load_pipeline(INFO))
    default = nhop({}, 1)
    default.is_default_action = True
    insert(store, default, p4runtime_pb2.Update.MODIFY)
    insert(
        store,
        INDEX.table_entry(
            p4names.THRESHOLD_TABLE,
            {"standard_metadata.egress_spec": 1},
            p4names.SET_THRESHOLDS,
            {"data_queue_bytes": 6000, "ecn_kmin": 100, "ecn_kmax": 3000, "ecn_pmax": 30000},
        ),
    )
    pipeline = Pipeline({1: EgressPort(1)}, CounterArrays(), seed=1)
    pipeline.forwarding = store.compile()
    return pipeline


VALID = bytes(
    Ether()
    / IP(src="10.0.0.1", dst="10.0.0.2", tos=2)
    / UDP(sport=1, dport=FORGIVE_UDP_PORT, chksum=0)
    / FTH(length=64, seq=0, aux=64)
    / bytes(64)
)


@settings(max_examples=300)
@given(
    frames=st.lists(
        st.one_of(
            st.binary(max_size=200),
            st.tuples(st.integers(0, len(VALID)), st.binary(max_size=64)).map(
                lambda cut: VALID[: cut[0]] + cut[1]
            ),
            st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)).map(
                lambda flip: VALID[: flip[0]] + bytes([flip[1]]) + VALID[flip[0] + 1 :]
            ),
        ),
        max_size=40,
    )
)
def test_every_frame_is_queued_or_dropped_with_a_reason(frames):
    pipeline = routed_pipeline()
    port = pipeline.ports[1]
    queued = 0
    for frame in frames:
        if pipeline.process(bytearray(frame), 0.0) is not None:
            queued += 1
    assert queued == len(port.high) + len(port.low)
    assert queued + sum(pipeline.dropped.values()) == len(frames)
    assert port.low_bytes == sum(len(f) for f, _ in port.low) <= 6000
