"""The model's P4Runtime service over real gRPC: pipeline checks, arbitration, error semantics."""

from __future__ import annotations

import json
import logging
import queue
import random
import re
import threading
import time

import grpc
import pytest
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from hypothesis import given
from hypothesis import strategies as st
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc
from switch_harness import device_config, free_tcp_port, p4info

from common import p4names
from controller.client import NotPrimary, SwitchClient, SwitchUnreachable, WriteFailed
from controller.p4info import P4InfoIndex
from switch_model.crc16 import crc16
from switch_model.dataplane import Dataplane
from switch_model.p4runtime_server import (
    DETAILS_BUDGET,
    MAX_STREAMS,
    SwitchService,
    check_device_config,
    serve,
)
from switch_model.surface import load_pipeline
from switch_model.tables import P4RuntimeError

_Update = p4runtime_pb2.Update
INDEX = P4InfoIndex(p4info())


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
    c.set_pipeline(p4info(), device_config(), 7)
    yield c
    c.close()


def update(kind, entry):
    u = _Update(type=kind)
    u.entity.table_entry.CopyFrom(entry)
    return u


def route(ip: int, port: int):
    return INDEX.table_entry(
        p4names.LPM_TABLE,
        {"hdr.ipv4.dstAddr": (ip, 32)},
        p4names.SET_NHOP,
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
    changed.tables[0].preamble.name = f"{p4names.INGRESS}.ipv4_routes"
    (thresholds,) = [a for a in changed.actions if a.preamble.name == p4names.SET_THRESHOLDS]
    thresholds.params[0].bitwidth = 16
    with pytest.raises(grpc.RpcError) as err:
        client.set_pipeline(changed, device_config(), 8)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"unknown table {p4names.INGRESS}.ipv4_routes" in err.value.details()
    assert f"missing table {p4names.LPM_TABLE}" in err.value.details()
    assert f"action {p4names.SET_THRESHOLDS} has params" in err.value.details()
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


def test_rollback_on_error_applies_nothing(server, client, caplog):
    """Three good updates and one bad: P4Runtime rolls the batch back, the bad update with
    its own code and every good one ABORTED. On the compiled build the store's copy for the
    batch once failed in the handler (gRPC's UNKNOWN, no details, a traceback in the log)."""
    too_wide = route(0x0A000004, 1)
    too_wide.match[0].lpm.value = b"\x01" * 5  # 40 bits for a 32-bit field
    request = p4runtime_pb2.WriteRequest(
        device_id=1,
        election_id=p4runtime_pb2.Uint128(low=10),
        atomicity=p4runtime_pb2.WriteRequest.ROLLBACK_ON_ERROR,
        updates=[
            update(_Update.INSERT, route(0x0A000001, 1)),
            update(_Update.INSERT, route(0x0A000002, 1)),
            update(_Update.INSERT, route(0x0A000003, 2)),
            update(_Update.INSERT, too_wide),
        ],
    )
    with caplog.at_level(logging.DEBUG), pytest.raises(grpc.RpcError) as err:
        client.stub.Write(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    codes = []
    for packed in status_of(err.value).details:
        error = p4runtime_pb2.Error()
        assert packed.Unpack(error)
        codes.append(code_pb2.Code.Name(error.canonical_code))
    assert codes == ["ABORTED", "ABORTED", "ABORTED", "OUT_OF_RANGE"]
    assert err.value.details().startswith("4 of 4 updates failed; first: update 0: ABORTED")
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert client.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())]) == []
    client.write(request.updates[:3])  # the store the batch was tried on is still the one used
    assert len(client.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())])) == 3


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda e: setattr(e.action.action, "action_id", 12345), "INVALID_ARGUMENT"),
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
    trims = index.counter(p4names.PORT_TRIMS)
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
        if e.counter_entry.counter_id == index.counter(p4names.PORT_TX).preamble.id
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
    query.table_entry.table_id = index.table_id(p4names.LPM_TABLE)
    query.table_entry.is_default_action = True
    (default,) = client.read([query])
    assert default.table_entry.action.action.action_id == index.actions[p4names.DROP].preamble.id
    entry = route(0, 2)
    del entry.match[:]
    entry.is_default_action = True
    client.write([update(_Update.MODIFY, entry)])
    assert service.dataplane.pipeline.forwarding.ipv4_lpm(0x01020304).port == 2
    with pytest.raises(WriteFailed) as err:
        client.write([update(_Update.INSERT, entry)])
    assert err.value.errors[0][1] == "INVALID_ARGUMENT"


class RawStream:
    """A StreamChannel driven by hand, to see every arbitration reply the server sends."""

    def __init__(self, address: str, election_id: int | None = None, arbitrate: bool = True):
        self.channel = grpc.insecure_channel(address)
        self.requests: queue.Queue = queue.Queue()
        stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self.call = stub.StreamChannel(iter(self.requests.get, None))
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        if arbitrate:
            self.arbitrate(election_id)

    def _pump(self) -> None:
        try:
            for reply in self.call:
                self.replies.put(reply)
        except grpc.RpcError as err:
            self.replies.put(err)

    def arbitrate(self, election_id: int | None) -> None:
        message = p4runtime_pb2.StreamMessageRequest()
        message.arbitration.device_id = 1
        if election_id is not None:
            message.arbitration.election_id.low = election_id
        self.requests.put(message)

    def wait_for(self, code: int, timeout: float = 5.0) -> p4runtime_pb2.MasterArbitrationUpdate:
        """The first arbitration reply with status `code`; fails on anything else at the end."""
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                reply = self.replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if isinstance(reply, grpc.RpcError):
                raise AssertionError(f"stream closed: {reply.code()} {reply.details()}")
            if reply.arbitration.status.code == code:
                return reply.arbitration
            seen.append(code_pb2.Code.Name(reply.arbitration.status.code))
        raise AssertionError(f"no {code_pb2.Code.Name(code)} reply; got {seen}")

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()
        self.channel.close()


def write_as(address: str, election_id: int | None) -> grpc.StatusCode:
    """The status of a one-route Write sent with `election_id` (None: left unset)."""
    request = p4runtime_pb2.WriteRequest(
        device_id=1, updates=[update(_Update.INSERT, route(0x0A0A0A0A, 1))]
    )
    if election_id is not None:
        request.election_id.low = election_id
    with grpc.insecure_channel(address) as channel:
        try:
            p4runtime_pb2_grpc.P4RuntimeStub(channel).Write(request, timeout=5)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def test_a_lower_election_id_stays_backup_after_the_primary_leaves(server, client):
    _, address = server
    client.close()
    late = RawStream(address, election_id=5)
    try:
        reply = late.wait_for(code_pb2.NOT_FOUND)
        assert (reply.election_id.high, reply.election_id.low) == (0, 10)
        assert write_as(address, 5) == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(SwitchUnreachable, match="not primary"):
            SwitchClient("s1", address, 1, election_id=9).connect()
        newer = SwitchClient("s1", address, 1, election_id=11)
        newer.connect()
        newer.write([update(_Update.INSERT, route(0x0A000077, 1))])
        assert late.wait_for(code_pb2.ALREADY_EXISTS).election_id.low == 11
        newer.close()
    finally:
        late.close()


def test_a_stream_without_election_id_is_kept_as_a_backup(server, client):
    _, address = server
    watcher = RawStream(address)
    try:
        assert watcher.wait_for(code_pb2.ALREADY_EXISTS).election_id.low == 10
        assert write_as(address, None) == grpc.StatusCode.PERMISSION_DENIED
        client.close()
        assert watcher.wait_for(code_pb2.NOT_FOUND).election_id.low == 10
        assert write_as(address, None) == grpc.StatusCode.PERMISSION_DENIED
        watcher.arbitrate(12)
        watcher.wait_for(code_pb2.OK)
        assert write_as(address, 12) == grpc.StatusCode.OK
    finally:
        watcher.close()


def capabilities(address: str) -> str:
    with grpc.insecure_channel(address) as channel:
        stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        reply = stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=3)
    return reply.p4runtime_api_version


def refused_streams(streams: list[RawStream], expected: int, timeout: float = 5.0):
    """The streams the server ended with RESOURCE_EXHAUSTED, once `expected` of them have
    been (an accepted stream that sent no arbitration hears nothing)."""
    deadline = time.monotonic() + timeout
    while True:
        ended = [s for s in streams if not s.replies.empty()]
        if len(ended) >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for stream in ended:
        reply = stream.replies.get_nowait()
        assert isinstance(reply, grpc.RpcError), reply
        assert reply.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(ended) == expected, f"{len(ended)} streams refused, {expected} expected"
    return ended


def test_idle_streams_never_starve_unary_calls(server):
    _, address = server
    idle = [RawStream(address, arbitrate=False) for _ in range(8)]
    try:
        assert capabilities(address) == "1.4.1"
        ctl = SwitchClient("s1", address, 1, election_id=2, timeout=3)
        ctl.connect()
        ctl.set_pipeline(p4info(), device_config(), 3)
        ctl.write([update(_Update.INSERT, route(0x0A000001, 1))])
        assert len(ctl.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())])) == 1
        idle += [RawStream(address, arbitrate=False) for _ in range(MAX_STREAMS - 8)]
        # One stream too many: each stream has its own channel, so the server may take them
        # in any order, and whichever it takes last is the one refused.
        (refused,) = refused_streams(idle, expected=1)
        idle.remove(refused)
        assert capabilities(address) == "1.4.1"
        assert len(ctl.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())])) == 1
        idle.pop().close()
        deadline = time.monotonic() + 5
        while True:
            again = RawStream(address, election_id=1)
            reply = again.replies.get(timeout=5)
            if isinstance(reply, p4runtime_pb2.StreamMessageResponse):
                assert reply.arbitration.status.code == code_pb2.ALREADY_EXISTS
                break
            assert reply.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline, "a closed stream's slot was never freed"
            time.sleep(0.05)
        idle.append(again)
        ctl.close()
    finally:
        for stream in idle:
            stream.close()


def status_of(err: grpc.RpcError) -> status_pb2.Status:
    (value,) = [v for k, v in err.trailing_metadata() if k == "grpc-status-details-bin"]
    return status_pb2.Status.FromString(value)


def test_a_large_failing_batch_keeps_its_first_errors_and_counts_the_rest(server, client):
    deletes = [update(_Update.DELETE, route(0x0B000000 + i, 1)) for i in range(500)]
    with pytest.raises(WriteFailed) as err:
        client.write(deletes)
    errors = err.value.errors
    assert 40 < len(errors) < 500
    assert [i for i, _, _ in errors] == list(range(len(errors)))
    assert {code for _, code, _ in errors} == {"NOT_FOUND"}
    request = p4runtime_pb2.WriteRequest(
        device_id=1, election_id=p4runtime_pb2.Uint128(low=10), updates=deletes
    )
    with pytest.raises(grpc.RpcError) as raw:
        client.stub.Write(request, timeout=5)
    status = status_of(raw.value)
    assert len(status.SerializeToString()) <= DETAILS_BUDGET + 600
    assert len(status.details) == len(errors)
    left = 500 - len(errors)
    assert raw.value.details() == status.message
    assert status.message.startswith("500 of 500 updates failed; first: update 0: NOT_FOUND")
    assert status.message.endswith(f"{left} failures left out")


def test_a_failure_past_the_details_budget_is_still_reported(server, client):
    inserts = [update(_Update.INSERT, route(0x0C000000 + i, 1)) for i in range(600)]
    with pytest.raises(WriteFailed) as err:
        client.write([*inserts, update(_Update.DELETE, route(0x0D000000, 1))])
    ((index, code, message),) = err.value.errors
    assert (index, code) == (-1, "UNKNOWN")
    assert message.startswith("1 of 601 updates failed; first: update 600: NOT_FOUND")
    assert message.endswith(", 1 failure left out")
    entities = client.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())])
    assert len(entities) == 600, "CONTINUE_ON_ERROR applied every update that succeeded"


def set_config(client: SwitchClient, device: bytes) -> grpc.StatusCode:
    try:
        client.set_pipeline(p4info(), device, 9)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_only_forgive_p4s_bmv2_json_is_taken_as_device_config(server, client):
    other = json.loads(device_config())
    other["pipelines"][0]["tables"] = [
        t for t in other["pipelines"][0]["tables"] if t["name"] != p4names.LPM_TABLE
    ]
    for device in (
        bytes(range(256)) * 4,
        b"",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"pipelines": []}',
        json.dumps({**other, "actions": "none"}).encode(),
        json.dumps(other).encode(),
    ):
        assert set_config(client, device) == grpc.StatusCode.INVALID_ARGUMENT, device[:40]
    with pytest.raises(grpc.RpcError, match="lacks table " + re.escape(p4names.LPM_TABLE)):
        client.set_pipeline(p4info(), json.dumps(other).encode(), 9)
    assert client.get_pipeline().cookie.cookie == 7
    assert set_config(client, device_config()) == grpc.StatusCode.OK
    assert client.get_pipeline().cookie.cookie == 9


BMV2_KEYS = st.sampled_from(
    ["__meta__", "pipelines", "tables", "actions", "counter_arrays", "name"]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(BMV2_KEYS, inner, max_size=5),
    max_leaves=30,
)
PIPE = load_pipeline(p4info())


@given(JSON)
def test_any_json_device_config_is_refused_in_one_clean_error(doc):
    with pytest.raises(P4RuntimeError) as err:
        check_device_config(json.dumps(doc).encode(), PIPE)
    assert err.value.code == code_pb2.INVALID_ARGUMENT


def test_a_reader_needs_no_mastership_and_a_second_writer_is_refused(server, client):
    _, address = server
    client.write([update(_Update.INSERT, route(0x0A000001, 1))])
    reader = SwitchClient("s1", address, 1, election_id=10)
    reader.connect(primary=False)
    try:
        entities = reader.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())])
        assert len(entities) == 1
    finally:
        reader.close()
    rival = SwitchClient("s1", address, 1, election_id=10)
    with pytest.raises(NotPrimary) as err:
        rival.connect()
    assert "\n" not in str(err.value) and "another controller" in str(err.value)
    client.write([update(_Update.INSERT, route(0x0A000002, 1))])  # still the primary


RANDOM_REQUEST = random.Random(25).randbytes(64)


@pytest.mark.parametrize(
    ("method", "kind"),
    [
        ("Write", "unary_unary"),
        ("SetForwardingPipelineConfig", "unary_unary"),
        ("GetForwardingPipelineConfig", "unary_unary"),
        ("Capabilities", "unary_unary"),
        ("Read", "unary_stream"),
        ("StreamChannel", "stream_stream"),
    ],
)
def test_a_request_of_random_bytes_is_invalid_argument_without_a_traceback(
    server, caplog, method, kind
):
    """P4Runtime answers a malformed request INVALID_ARGUMENT; grpcio's own failure to parse
    it is INTERNAL and logs a traceback in the switch's log."""
    with pytest.raises(DecodeError):
        getattr(p4runtime_pb2, f"{method}Request", p4runtime_pb2.StreamMessageRequest).FromString(
            RANDOM_REQUEST
        )
    _, address = server
    with grpc.insecure_channel(address) as channel:
        call = getattr(channel, kind)(f"/p4.v1.P4Runtime/{method}")
        with caplog.at_level(logging.DEBUG), pytest.raises(grpc.RpcError) as err:
            if kind == "unary_unary":
                call(RANDOM_REQUEST, timeout=5)
            elif kind == "unary_stream":
                list(call(RANDOM_REQUEST, timeout=5))
            else:
                list(call(iter([RANDOM_REQUEST]), timeout=5))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request is not a p4.v1." in err.value.details()
        assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert capabilities(address) == "1.4.1"  # and the switch still serves
