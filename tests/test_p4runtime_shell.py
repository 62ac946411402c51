"""An outside P4Runtime client, p4runtime-shell, drives the model and BMv2 alike.

The project talks P4Runtime through its own client (`controller.client`). This
test checks the targets against a standard client instead: the shell sets the
pipeline, writes an entry of every kind to every table, modifies and deletes
some, sets counters and reads everything back; the entries it reads must be the
ones `controller.entries` builds, and the project's client, reading alongside
without mastership, must see the same state.
"""

from __future__ import annotations

import ipaddress

import pytest
from p4.v1 import p4runtime_pb2
from switch_harness import Bmv2Process, model_switch

from common import p4names
from controller import DEVICE_CONFIG, P4INFO, entries
from controller.client import SwitchClient
from controller.p4info import P4InfoIndex, entry_action, entry_key, load_p4info
from switch_model import surface
from switch_model.surface import PortCounters, SwitchTrimming, Thresholds

sh = pytest.importorskip("p4runtime_sh.shell", reason="p4runtime-shell (test extras) missing")

DEVICE_ID = 1


# BMv2 runs as a process of its own, which the emulation tests look for as a leftover:
# it runs with the namespace tests, under their lock; the model runs in this process.
@pytest.fixture(params=["model", pytest.param("bmv2", marks=pytest.mark.netns)])
def switch(request):
    """The gRPC address of a fresh switch of the given target, with no pipeline."""
    if request.param == "model":
        with model_switch(DEVICE_ID) as address:
            yield address
        return
    reason = Bmv2Process.missing()
    if reason:
        pytest.skip(f"BMv2: {reason}")
    with Bmv2Process({}, device_id=DEVICE_ID) as bmv2:
        yield bmv2.grpc


@pytest.fixture
def shell(switch):
    sh.setup(
        device_id=DEVICE_ID,
        grpc_addr=switch,
        election_id=(0, 1),
        config=sh.FwdPipeConfig(str(P4INFO), str(DEVICE_CONFIG)),
        verbose=False,
    )
    try:
        yield switch
    finally:
        sh.teardown()


def shell_entry(info, entry: p4runtime_pb2.TableEntry):
    """`entry` as the shell builds it: from the P4Info's names and values written as text."""
    table = next(t for t in info.tables if t.preamble.id == entry.table_id)
    action = next(a for a in info.actions if a.preamble.id == entry.action.action.action_id)
    fields = {f.id: f.name for f in table.match_fields}
    params = {p.id: p.name for p in action.params}
    shell = sh.TableEntry(table.preamble.name)(
        action=action.preamble.name, is_default=entry.is_default_action
    )
    for m in entry.match:
        if m.HasField("lpm"):
            address = ipaddress.IPv4Address(int.from_bytes(m.lpm.value, "big"))
            text = f"{address}/{m.lpm.prefix_len}"
        elif m.HasField("ternary"):
            value, mask = (int.from_bytes(v, "big") for v in (m.ternary.value, m.ternary.mask))
            text = f"{value:#x}&&&{mask:#x}"
        else:
            text = str(int.from_bytes(m.exact.value, "big"))
        shell.match[fields[m.field_id]] = text
    if entry.priority:
        shell.priority = entry.priority
    for param in entry.action.action.params:
        shell.action[params[param.param_id]] = str(int.from_bytes(param.value, "big"))
    return shell


def identities(found) -> set[tuple]:
    return {(entry_key(e), entry_action(e)) for e in found}


def test_shell_and_project_client_agree_on_every_table_and_counter(shell):
    index = P4InfoIndex(load_p4info(P4INFO))
    reader = SwitchClient("reader", shell, DEVICE_ID)
    reader.connect(primary=False)
    try:
        pipeline = reader.get_pipeline()
        assert [t.preamble.name for t in pipeline.p4info.tables] == [
            t.preamble.name for t in index.p4info.tables
        ]

        limits = Thresholds(4154 * 6, 4154 * 2, 4154 * 4, surface.PMAX_ONE)
        wanted = [
            entries.port_thresholds(index, 2, limits),
            entries.ecmp_member(index, 5, 0, 0x020000000002, 2),
            entries.ecmp_member(index, 5, 1, 0x020000000003, 3),
            entries.ecmp_route(index, 0x0A000900, 24, 5, 2),
            entries.trim_ineligible(index, 18),
            entries.trim_acl(index, 5, src=(0x0A000107, 32), dscp=20),
            entries.trim_dscp(index, 2, 3),
            entries.trim_queue_limit(index, 2, 116),
            entries.control_queue(index, 1),
            entries.route(index, 0x0A000202, 32, 0x020000000002, 2),
        ]
        for entry in wanted:
            shell_entry(index.p4info, entry).insert()
        wanted[-1] = entries.route(index, 0x0A000202, 32, 0x020000000003, 3)
        shell_entry(index.p4info, wanted[-1]).modify()
        shell_entry(index.p4info, wanted.pop(2)).delete()
        # a table without key has only its default entry
        wanted.append(entries.switch_trimming(index, SwitchTrimming(128, 1)))
        shell_entry(index.p4info, wanted[-1]).modify()

        for table in surface.TABLE_KEYS:
            table_id = index.table_id(table)
            expected = identities(e for e in wanted if e.table_id == table_id)
            assert expected, f"the test writes no entry to {table}"
            keyless = not surface.TABLE_KEYS[table]
            shell_read = sh.TableEntry(table)(is_default=keyless).read()
            assert identities(e.msg() for e in shell_read) == expected
            query = p4runtime_pb2.Entity()
            query.table_entry.table_id = table_id
            query.table_entry.is_default_action = keyless
            assert identities(e.table_entry for e in reader.read([query])) == expected

        counts = {
            p4names.PORT_TX: (7, 7 * 4154),
            p4names.PORT_CE_MARKS: (3, 0),
            p4names.PORT_TRIMS: (2, 0),
            p4names.PORT_TRIM_TX: (1, 0),
            p4names.PORT_TRIM_DROPS: (1, 0),
            p4names.PORT_DROPS: (1, 0),
        }
        for name, (packets, byte_count) in counts.items():
            counter = sh.CounterEntry(name)
            counter.index = 2
            counter.packet_count = packets
            if byte_count:
                counter.byte_count = byte_count
            counter.modify()
        for name, (packets, byte_count) in counts.items():
            every = list(sh.CounterEntry(name).read())
            assert len(every) == index.counter(name).size
            by_index = {c.index: c for c in every}
            assert by_index[2].packet_count == packets
            assert by_index[2].byte_count == byte_count
            assert by_index[3].packet_count == 0
        assert entries.read_port_counters(reader, index, [2, 3]) == {
            2: PortCounters(
                tx_packets=7,
                tx_bytes=7 * 4154,
                ce_marks=3,
                trims=2,
                drops=1,
                trim_tx=1,
                trim_drops=1,
            ),
            3: PortCounters(),
        }
    finally:
        reader.close()
