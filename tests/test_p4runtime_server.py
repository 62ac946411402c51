"""The model's P4Runtime service over real gRPC: pipeline checks, arbitration, error semantics."""

from __future__ import annotations

import grpc
import pytest
from p4.v1 import p4runtime_pb2
from switch_harness import free_tcp_port, p4info

from controller.client import SwitchClient, SwitchUnreachable, WriteFailed
from controller.p4info import P4InfoIndex
from switch_model.crc16 import crc16
from switch_model.dataplane import Dataplane
from switch_model.p4runtime_server import SwitchService, serve

_Update = p4runtime_pb2.Update


@pytest.fixture
def server():
    dataplane = Dataplane({1: "unused1", 2: "unused2"})
    service = SwitchService(1, dataplane)
    address = f"127.0.0.1:{free_tcp_port()}"
    grpc_server = serve(service, address)
    yield service, address
    grpc_server.stop(0).wait()


@pytest.fixture
def client(server):
    _, address = server
    c = SwitchClient("s1", address, 1, election_id=10)
    c.connect()
    c.set_pipeline(p4info(), b"{}", 7)
    yield c
    c.close()


def update(kind, entry):
    u = _Update(type=kind)
    u.entity.table_entry.CopyFrom(entry)
    return u


def route(ip: int, port: int):
    return P4InfoIndex(p4info()).table_entry(
        "MyIngress.ipv4_lpm",
        {"hdr.ipv4.dstAddr": (ip, 32)},
        "MyIngress.set_nhop",
        {"dmac": 0x020000000001, "port": port},
    )


def test_crc16_is_bmv2s_reflected_0x8005():
    def reference(data):
        # BMv2's formulation: reflect each input byte, MSB-first table-less division by
        # 0x8005, reflect the 16-bit remainder.
        def reflect(v, n):
            return int(f"{v:0{n}b}"[::-1], 2)

        rem = 0
        for byte in data:
            rem ^= reflect(byte, 8) << 8
            for _ in range(8):
                rem = ((rem << 1) ^ 0x8005) & 0xFFFF if rem & 0x8000 else (rem << 1) & 0xFFFF
        return reflect(rem, 16)

    assert crc16(b"123456789") == 0xBB3D
    for data in (
        b"",
        b"\x00",
        bytes(range(13)),
        b"\xff" * 13,
        bytes([10, 0, 1, 1, 10, 0, 2, 2, 17, 1, 2, 3, 4]),
    ):
        assert crc16(data) == reference(data)


def test_pipeline_round_trip_and_cookie(server, client):
    config = client.get_pipeline()
    assert config.cookie.cookie == 7
    assert [t.preamble.name for t in config.p4info.tables] == [
        t.preamble.name for t in p4info().tables
    ]


def test_a_p4info_the_model_does_not_implement_is_refused(server, client):
    changed = p4info()
    changed.tables[0].preamble.name = "MyIngress.ipv4_routes"
    (thresholds,) = [a for a in changed.actions if a.preamble.name == "MyIngress.set_thresholds"]
    thresholds.params[0].bitwidth = 16
    with pytest.raises(grpc.RpcError) as err:
        client.set_pipeline(changed, b"{}", 8)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown table MyIngress.ipv4_routes" in err.value.details()
    assert "missing table MyIngress.ipv4_lpm" in err.value.details()
    assert "action MyIngress.set_thresholds has params" in err.value.details()
    assert client.get_pipeline().cookie.cookie == 7


def test_write_errors_are_reported_per_update(server, client):
    client.write([update(_Update.INSERT, route(0x0A000001, 1))])
    bad_table = route(0x0A000003, 1)
    bad_table.table_id = 99
    with pytest.raises(WriteFailed) as err:
        client.write(
            [
                update(_Update.INSERT, route(0x0A000001, 1)),
                update(_Update.INSERT, route(0x0A000002, 2)),
                update(_Update.DELETE, route(0x0A000009, 1)),
                update(_Update.MODIFY, bad_table),
            ]
        )
    assert [(i, code) for i, code, _ in err.value.errors] == [
        (0, "ALREADY_EXISTS"),
        (2, "NOT_FOUND"),
        (3, "NOT_FOUND"),
    ]
    entities = client.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())])
    assert len(entities) == 2, "CONTINUE_ON_ERROR keeps the update that succeeded"


def test_rollback_on_error_applies_nothing(server, client):
    request = p4runtime_pb2.WriteRequest(
        device_id=1,
        election_id=p4runtime_pb2.Uint128(low=10),
        atomicity=p4runtime_pb2.WriteRequest.ROLLBACK_ON_ERROR,
        updates=[
            update(_Update.INSERT, route(0x0A000005, 1)),
            update(_Update.DELETE, route(0x0A000006, 1)),
        ],
    )
    with pytest.raises(grpc.RpcError) as err:
        client.stub.Write(request)
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert client.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())]) == []


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda e: setattr(e.action.action, "action_id", 12345), "NOT_FOUND"),
        (lambda e: e.action.action.params[1].__setattr__("value", b"\x02\x00"), "INVALID_ARGUMENT"),
        (lambda e: e.match[0].lpm.__setattr__("prefix_len", 24), "INVALID_ARGUMENT"),
        (lambda e: e.match[0].__setattr__("field_id", 9), "INVALID_ARGUMENT"),
        (lambda e: setattr(e, "priority", 5), "INVALID_ARGUMENT"),
        (lambda e: e.action.action.params.pop(), "INVALID_ARGUMENT"),
    ],
)
def test_invalid_entries_are_refused_with_the_spec_code(server, client, mutate, code):
    entry = route(0x0A000101, 1)
    mutate(entry)
    with pytest.raises(WriteFailed) as err:
        client.write([update(_Update.INSERT, entry)])
    assert err.value.errors[0][1] == code


def test_only_the_primary_may_write(server, client):
    _, address = server
    backup = SwitchClient("s1", address, 1, election_id=3)
    with pytest.raises(SwitchUnreachable, match="not primary"):
        backup.connect()
    request = p4runtime_pb2.WriteRequest(
        device_id=1,
        election_id=p4runtime_pb2.Uint128(low=3),
        updates=[update(_Update.INSERT, route(1, 1))],
    )
    with pytest.raises(grpc.RpcError) as err:
        client.stub.Write(request)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_wrong_device_and_missing_pipeline(server):
    _, address = server
    with pytest.raises(SwitchUnreachable):
        SwitchClient("s1", address, 42, timeout=2).connect()
    fresh = SwitchClient("s1", address, 1, election_id=5)
    fresh.connect()
    with pytest.raises(grpc.RpcError) as err:
        fresh.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    fresh.close()


def test_counters_read_modify_and_wildcards(server, client):
    service, _ = server
    index = P4InfoIndex(p4info())
    service.dataplane.counters.trims[2] = 5
    service.dataplane.counters.tx_bytes[2] = 4154
    service.dataplane.counters.tx_packets[2] = 1
    trims = index.counter("MyIngress.port_trims")
    query = p4runtime_pb2.Entity()
    query.counter_entry.counter_id = trims.preamble.id
    entries = client.read([query])
    assert len(entries) == trims.size
    assert entries[2].counter_entry.data.packet_count == 5
    everything = client.read([p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry())])
    assert len(everything) == sum(c.size for c in p4info().counters)
    tx = [
        e
        for e in everything
        if e.counter_entry.counter_id == index.counter("MyEgress.port_tx").preamble.id
    ]
    assert (tx[2].counter_entry.data.packet_count, tx[2].counter_entry.data.byte_count) == (1, 4154)
    reset = _Update(type=_Update.MODIFY)
    reset.entity.counter_entry.counter_id = trims.preamble.id
    reset.entity.counter_entry.index.index = 2
    client.write([reset])
    assert service.dataplane.counters.trims[2] == 0


def test_default_action_can_be_read_and_modified(server, client):
    service, _ = server
    index = P4InfoIndex(p4info())
    query = p4runtime_pb2.Entity()
    query.table_entry.table_id = index.table_id("MyIngress.ipv4_lpm")
    query.table_entry.is_default_action = True
    (default,) = client.read([query])
    assert (
        default.table_entry.action.action.action_id == index.actions["MyIngress.drop"].preamble.id
    )
    entry = route(0, 2)
    del entry.match[:]
    entry.is_default_action = True
    client.write([update(_Update.MODIFY, entry)])
    assert service.dataplane.pipeline.forwarding.ipv4_lpm(0x01020304).port == 2
    with pytest.raises(WriteFailed) as err:
        client.write([update(_Update.INSERT, entry)])
    assert err.value.errors[0][1] == "INVALID_ARGUMENT"
