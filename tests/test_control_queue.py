"""Transport control behind data (forgive.p4's control_queue, the fabric's `[switch] control =
"data"`): the opcodes the controller names wait in the data queue, as ns-3's switches queue
ACKs with data; every other packet, and trimmed headers always, go ahead as before."""

from __future__ import annotations

import pytest
from p4.v1 import p4runtime_pb2
from scapy.layers.inet import UDP
from test_pipeline import INDEX, data, ip, p4info, rig

from common import p4names
from common.wire import FORGIVE_UDP_PORT, Flag, Opcode
from controller.fabric_control import switch_entries
from controller.p4info import ConfigError
from controller.topology import parse as parse_description
from host_agent.scapy_layer import FTH
from runplan.fabric import FabricError, parse, plan, preset
from runs.options import with_settings
from simulator.engine import sim_endpoints
from switch_model.surface import load_pipeline
from switch_model.tables import TableStore


def control(opcode: Opcode, flags: int = 0, length: int = 4) -> bytearray:
    return bytearray(
        bytes(
            ip()
            / UDP(sport=1, dport=FORGIVE_UDP_PORT)
            / FTH(opcode=opcode, flags=flags, length=length)
        )
    )


def queue_with_data(pipeline, *opcodes: Opcode, data_queue_bytes: int = 3000) -> None:
    """The pipeline's tables: a route to port 2, its data queue, and an entry per opcode."""
    store_entries = [
        INDEX.table_entry(
            p4names.CONTROL_QUEUE_TABLE, {p4names.FTH_OPCODE: int(op)}, p4names.QUEUE_WITH_DATA, {}
        )
        for op in opcodes
    ]
    store = TableStore(load_pipeline(p4info()))
    for entry in [*_routes(data_queue_bytes), *store_entries]:
        update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
        update.entity.table_entry.CopyFrom(entry)
        store.apply(update)
    pipeline.forwarding = store.compile()


def _routes(data_queue_bytes: int):
    return [
        INDEX.table_entry(
            p4names.LPM_TABLE,
            {p4names.DST_ADDR: (0x0A000200, 24)},
            p4names.SET_NHOP,
            {"dmac": 0x020000000002, "port": 2},
        ),
        INDEX.table_entry(
            p4names.THRESHOLD_TABLE,
            {p4names.EGRESS_SPEC: 2},
            p4names.SET_THRESHOLDS,
            {
                "data_queue_bytes": data_queue_bytes,
                "ecn_kmin": 1 << 30,
                "ecn_kmax": 1 << 30,
                "ecn_pmax": 0,
            },
        ),
    ]


def test_without_an_entry_every_control_packet_goes_ahead_of_data():
    pipeline = rig(data_queue_bytes=3000)
    port = pipeline.process(control(Opcode.ACK), 0.0)
    assert port is pipeline.ports[2] and port.high_bytes > 0 and port.low_bytes == 0


def test_an_entry_queues_that_opcode_with_data_and_nothing_else():
    pipeline = rig(data_queue_bytes=3000)
    queue_with_data(pipeline, Opcode.ACK, Opcode.NACK)
    port = pipeline.ports[2]
    pipeline.process(control(Opcode.ACK), 0.0)
    pipeline.process(control(Opcode.NACK, length=4096), 0.0)
    assert port.low_bytes > 0 and port.high_bytes == 0
    pipeline.process(control(Opcode.CNP, length=0), 0.0)
    assert port.high_bytes > 0, "a CNP without an entry still goes ahead"


def test_trimmed_headers_go_ahead_whatever_the_table_holds():
    pipeline = rig(data_queue_bytes=3000)
    queue_with_data(pipeline, Opcode.DATA, Opcode.ACK)
    port = pipeline.ports[2]
    pipeline.process(control(Opcode.DATA, flags=int(Flag.TRIMMED), length=4096), 0.0)
    assert port.high_bytes > 0 and port.low_bytes == 0


def test_control_queued_with_data_is_dropped_by_a_full_data_queue_never_trimmed():
    frame = bytearray(data(payload=1000))
    pipeline = rig()
    queue_with_data(pipeline, Opcode.ACK, data_queue_bytes=len(frame) + 10)
    port = pipeline.ports[2]
    pipeline.process(frame, 0.0)  # the data queue has 10 bytes left: no room for an ACK
    assert pipeline.process(control(Opcode.ACK), 0.0) is None
    assert port.low_bytes == len(frame) and port.high_bytes == 0, "dropped, not trimmed"
    assert pipeline.dropped["data queue full"] == 1


def test_the_fabric_sets_it_and_the_controller_writes_an_entry_per_opcode():
    spec = parse({"leaves": 2, "spines": 1, "hosts_per_leaf": 2, "switch": {"control": "data"}})
    assert spec.switch.control == "data"
    assert with_settings(preset("2to1"), {"control": "data"}).switch.control == "data"
    fabric_plan = plan(spec)
    endpoints = sim_endpoints(fabric_plan.switches)
    fabric = parse_description(fabric_plan.controller_description(endpoints))
    assert fabric.control_with_data == (Opcode.ACK, Opcode.NACK, Opcode.CNP)
    written = [
        e
        for e in switch_entries(fabric, INDEX, "leaf1")
        if e.table_id == INDEX.table_id(p4names.CONTROL_QUEUE_TABLE)
    ]
    assert len(written) == 3
    plain = parse_description(plan(preset("2to1")).controller_description(endpoints))
    assert plain.control_with_data == ()
    with pytest.raises(
        FabricError, match=r"\[switch\] control must be one of high, data, got 'low'"
    ):
        parse({"leaves": 2, "spines": 1, "hosts_per_leaf": 2, "switch": {"control": "low"}})
    with pytest.raises(ConfigError, match="control_queue: unknown 'syn'"):
        parse_description({**plain_description(endpoints), "control_queue": ["syn"]})


def plain_description(endpoints):
    return plan(preset("2to1")).controller_description(endpoints)
