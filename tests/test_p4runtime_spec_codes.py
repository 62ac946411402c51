"""Status codes P4Runtime 1.4 prescribes, asked of the model and of BMv2 where it is installed.

Each case is one request (or a short exchange) against a fresh switch with forgive.p4
pushed. The model
must answer what the specification says; BMv2 (its PI server) is held to what it
answers, so a difference is written down here and in docs/switch_model.md rather
than found by a controller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import grpc
import pytest
from p4.v1 import p4runtime_pb2
from switch_harness import Bmv2Process, device_config, free_tcp_port, p4info

from common import p4names
from controller.client import SwitchClient, SwitchUnreachable, WriteFailed
from controller.p4info import P4InfoIndex
from switch_model.dataplane import Dataplane
from switch_model.p4runtime_server import SwitchService, serve

_Update = p4runtime_pb2.Update
_Set = p4runtime_pb2.SetForwardingPipelineConfigRequest
INDEX = P4InfoIndex(p4info())


@pytest.fixture(params=["model", "bmv2"])
def switch(request) -> Iterator[tuple[str, SwitchClient]]:
    """(target, a primary client of a switch running forgive.p4)."""
    with ExitStack() as stack:
        if request.param == "model":
            address = f"127.0.0.1:{free_tcp_port()}"
            server = serve(SwitchService(1, Dataplane({1: "unused1", 2: "unused2"})), address)
            stack.callback(lambda: server.stop(0).wait())
        else:
            if Bmv2Process.missing():
                pytest.skip(Bmv2Process.missing())
            address = stack.enter_context(Bmv2Process({})).grpc
        client = SwitchClient("s1", address, 1, election_id=10, timeout=10)
        stack.callback(client.close)
        client.connect()
        client.set_pipeline(p4info(), device_config(), 1)
        yield request.param, client


def route_to(ip: int, kind: int = _Update.INSERT, **change) -> p4runtime_pb2.Update:
    entry = INDEX.table_entry(
        p4names.LPM_TABLE,
        {"hdr.ipv4.dstAddr": (ip, 32)},
        p4names.SET_NHOP,
        {"dmac": 0x020000000001, "port": 1},
    )
    for key, value in change.items():
        setattr(entry, key, value)
    u = _Update(type=kind)
    u.entity.table_entry.CopyFrom(entry)
    return u


def route(**change) -> p4runtime_pb2.Update:
    return route_to(0x0A000001, **change)


def write_code(client: SwitchClient, u: p4runtime_pb2.Update) -> str:
    try:
        client.write([u])
    except WriteFailed as err:
        return err.errors[0][1]
    return "OK"


def wide_match(client):
    u = route()
    u.entity.table_entry.match[0].lpm.value = b"\x01" + bytes(4)
    return write_code(client, u)


def empty_match(client):
    entry = INDEX.table_entry(
        p4names.ECMP_TABLE,
        {"meta.ecmp_group_id": 1, "meta.ecmp_member": 0},
        p4names.SET_NHOP,
        {"dmac": 1, "port": 1},
    )
    entry.match[0].exact.value = b""
    u = _Update(type=_Update.INSERT)
    u.entity.table_entry.CopyFrom(entry)
    return write_code(client, u)


def const_entry(client):
    return write_code(client, route(is_const=True))


def unknown_action(client):
    u = route()
    u.entity.table_entry.action.action.action_id = 12345
    return write_code(client, u)


def set_pipeline(client: SwitchClient, action: int, config: bytes | None) -> str:
    request = _Set(device_id=1, election_id=p4runtime_pb2.Uint128(low=10), action=action)
    if config is not None:
        request.config.p4info.CopyFrom(p4info())
        request.config.p4_device_config = config
    try:
        client.stub.SetForwardingPipelineConfig(request, timeout=30)
    except grpc.RpcError as err:
        return err.code().name
    return "OK"


def commit_nothing_saved(client):
    return set_pipeline(client, _Set.COMMIT, None)


def commit_with_config(client):
    assert set_pipeline(client, _Set.VERIFY_AND_SAVE, device_config()) == "OK"
    return set_pipeline(client, _Set.COMMIT, device_config())


def random_device_config(client):
    return set_pipeline(client, _Set.VERIFY_AND_COMMIT, bytes(range(256)) * 4)


def counter_update(index: int | None) -> p4runtime_pb2.Update:
    u = _Update(type=_Update.MODIFY)
    entry = u.entity.counter_entry
    entry.counter_id = INDEX.counter(p4names.PORT_TRIMS).preamble.id
    if index is not None:
        entry.index.index = index
    entry.data.packet_count = 7
    return u


def counter_without_index(client):
    code = write_code(client, counter_update(None))
    if code == "OK":
        query = p4runtime_pb2.Entity()
        query.counter_entry.counter_id = INDEX.counter(p4names.PORT_TRIMS).preamble.id
        cells = [e.counter_entry.data.packet_count for e in client.read([query])]
        assert cells and set(cells) == {7}, "a MODIFY without index sets every cell"
    return code


def counter_negative_index(client):
    return write_code(client, counter_update(-1))


def lower_id_after_the_primary_left(client):
    client.close()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        late = SwitchClient("s2", client.address, 1, election_id=5, timeout=3)
        try:
            late.connect()
        except SwitchUnreachable:
            time.sleep(0.2)
            continue
        late.close()
        return "primary"
    return "backup"


def many_failures(client):
    try:
        client.write([route_to(0x0B000000 + i, _Update.DELETE) for i in range(200)])
    except WriteFailed as err:
        return err.errors[0][1]
    except grpc.RpcError as err:
        return err.code().name
    return "OK"


CASES: dict[str, tuple[Callable[[SwitchClient], str], str, str]] = {
    # case: (request, the specification's answer (the model's), BMv2's answer)
    "match value wider than its field": (wide_match, "OUT_OF_RANGE", "INVALID_ARGUMENT"),
    "empty match value": (empty_match, "OUT_OF_RANGE", "OK"),
    "is_const entry": (const_entry, "INVALID_ARGUMENT", "OK"),
    "unknown action id": (unknown_action, "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
    "COMMIT with nothing saved": (commit_nothing_saved, "NOT_FOUND", "UNKNOWN"),
    "COMMIT carrying a config": (commit_with_config, "INVALID_ARGUMENT", "OK"),
    "counter MODIFY without index": (counter_without_index, "OK", "UNIMPLEMENTED"),
    "counter index -1": (counter_negative_index, "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
    "device config of random bytes": (random_device_config, "INVALID_ARGUMENT", "UNKNOWN"),
    "id 5 once the primary (10) left": (lower_id_after_the_primary_left, "backup", "primary"),
    "200 failing updates in one Write": (many_failures, "NOT_FOUND", "RESOURCE_EXHAUSTED"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_status_code(switch, case):
    target, client = switch
    request, spec, bmv2 = CASES[case]
    assert request(client) == (spec if target == "model" else bmv2)
