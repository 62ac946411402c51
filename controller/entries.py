"""forgive.p4's table entries and port counters, spelled once by the surface's names.

The controller, the PTF suite, the tests and the benchmarks install the same
few kinds of entry (a route, an ECMP group and its members, a port's
thresholds, the trimming settings) and read the same counters; they all build
them here, so a name or a parameter changes in one place.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from p4.v1 import p4runtime_pb2

from common import p4names
from common.wire import MAX_DSCP
from controller.client import SwitchClient
from controller.p4info import P4InfoIndex
from switch_model import surface
from switch_model.surface import PortCounters, SwitchTrimming, Thresholds

IPV4_MASK = (1 << 32) - 1


def route(index: P4InfoIndex, prefix: int, prefix_len: int, dmac: int, port: int):
    """`prefix/prefix_len` straight to one next hop."""
    return index.table_entry(
        p4names.LPM_TABLE,
        {p4names.DST_ADDR: (prefix, prefix_len)},
        p4names.SET_NHOP,
        {"dmac": dmac, "port": port},
    )


def ecmp_route(index: P4InfoIndex, prefix: int, prefix_len: int, group: int, members: int):
    """`prefix/prefix_len` to ECMP group `group` of `members` members."""
    return index.table_entry(
        p4names.LPM_TABLE,
        {p4names.DST_ADDR: (prefix, prefix_len)},
        p4names.SET_ECMP_GROUP,
        {"group_id": group, "num_members": members},
    )


def ecmp_member(index: P4InfoIndex, group: int, member: int, dmac: int, port: int):
    """Member `member` (0-based) of ECMP group `group`: one next hop."""
    return index.table_entry(
        p4names.ECMP_TABLE,
        {p4names.ECMP_GROUP_ID: group, p4names.ECMP_MEMBER: member},
        p4names.SET_NHOP,
        {"dmac": dmac, "port": port},
    )


def port_thresholds(index: P4InfoIndex, port: int, thresholds: Thresholds):
    """Makes `port` a managed port with these admission limits."""
    return index.table_entry(
        p4names.THRESHOLD_TABLE,
        {p4names.EGRESS_SPEC: port},
        p4names.SET_THRESHOLDS,
        thresholds._asdict(),
    )


def switch_trimming(index: P4InfoIndex, trimming: SwitchTrimming | None):
    """switch_trimming's default entry: the switch-wide trim size and queue, or NoAction
    (58 bytes to the high queue, as the program sets them first)."""
    if trimming is None:
        return index.default_entry(p4names.SWITCH_TRIMMING_TABLE, p4names.NO_ACTION)
    return index.default_entry(
        p4names.SWITCH_TRIMMING_TABLE, p4names.SET_SWITCH_TRIMMING, trimming._asdict()
    )


@dataclass(frozen=True)
class TrimDscpTable:
    """Where a program resolves a trimmed packet's DSCP per egress port: forgive.p4 in
    ingress, the TNA program in egress (controller.tofino); the entries are alike."""

    table: str = p4names.TRIM_DSCP_TABLE
    action: str = p4names.SET_TRIM_DSCP
    port_key: str = p4names.EGRESS_SPEC


V1MODEL_TRIM_DSCP = TrimDscpTable()


def trim_dscp_default(
    index: P4InfoIndex, dscp: int | None, where: TrimDscpTable = V1MODEL_TRIM_DSCP
):
    """trim_dscp's default entry: one DSCP for every port, or NoAction (the DSCP is kept)."""
    if dscp is None:
        return index.default_entry(where.table, p4names.NO_ACTION)
    return index.default_entry(where.table, where.action, {"dscp": dscp})


def trim_dscp(index: P4InfoIndex, port: int, dscp: int, where: TrimDscpTable = V1MODEL_TRIM_DSCP):
    """Trimmed packets leaving `port` get `dscp` (asymmetric DSCP)."""
    return index.table_entry(where.table, {where.port_key: port}, where.action, {"dscp": dscp})


def trim_queue_limit(index: P4InfoIndex, port: int, trim_queue_bytes: int):
    """A trimmed packet finding `port`'s high queue at `trim_queue_bytes` is dropped."""
    return index.table_entry(
        p4names.TRIM_QUEUE_TABLE,
        {p4names.EGRESS_SPEC: port},
        p4names.SET_TRIM_QUEUE_BYTES,
        {"trim_queue_bytes": trim_queue_bytes},
    )


def control_queue(index: P4InfoIndex, opcode: int):
    """Transport control with FTH opcode `opcode` waits in the data queue, behind data."""
    return index.table_entry(
        p4names.CONTROL_QUEUE_TABLE, {p4names.FTH_OPCODE: opcode}, p4names.QUEUE_WITH_DATA, {}
    )


def trim_ineligible(index: P4InfoIndex, dscp: int):
    """Traffic class `dscp` is dropped, not trimmed, when its queue is full."""
    return index.table_entry(
        p4names.TRIM_ELIGIBILITY_TABLE, {p4names.DSCP: dscp}, p4names.DISABLE_TRIM, {}
    )


def trim_acl(
    index: P4InfoIndex,
    priority: int,
    src: tuple[int, int] | None = None,
    dst: tuple[int, int] | None = None,
    dscp: int | None = None,
):
    """A DISABLE_TRIM rule: packets from `src` and to `dst` (address, prefix length) with
    `dscp` are dropped, not trimmed; a field left None matches everything."""

    def prefix(net: tuple[int, int] | None) -> tuple[int, int]:
        if net is None:
            return (0, 0)
        mask = IPV4_MASK ^ (IPV4_MASK >> net[1])
        return (net[0] & mask, mask)

    return index.table_entry(
        p4names.TRIM_ACL_TABLE,
        {
            p4names.SRC_ADDR: prefix(src),
            p4names.DST_ADDR: prefix(dst),
            p4names.DSCP: (0, 0) if dscp is None else (dscp, MAX_DSCP),
        },
        p4names.DISABLE_TRIM,
        {},
        priority=priority,
    )


def read_port_counters(
    client: SwitchClient,
    index: P4InfoIndex,
    ports: Iterable[int],
    fields: dict[str, tuple[str | None, str]] = surface.COUNTER_FIELDS,
) -> dict[int, PortCounters]:
    """Every counter of each port in `ports`, in one Read. `fields` names the counters
    and the PortCounters fields they fill; counters filling one field add up (the
    Tofino program counts drops in ingress and in egress)."""
    ports = sorted(set(ports))
    if not ports:
        return {}
    query = []
    for name in fields:
        counter_id = index.counter(name).preamble.id
        for port in ports:
            entity = p4runtime_pb2.Entity()
            entity.counter_entry.counter_id = counter_id
            entity.counter_entry.index.index = port
            query.append(entity)
    values: dict[int, dict[str, int]] = {port: {} for port in ports}
    for entity in client.read(query):
        entry = entity.counter_entry
        row = values.get(entry.index.index)
        if row is None:
            continue
        byte_field, packet_field = fields[index.counter_names[entry.counter_id]]
        if byte_field is not None:
            row[byte_field] = row.get(byte_field, 0) + entry.data.byte_count
        row[packet_field] = row.get(packet_field, 0) + entry.data.packet_count
    return {port: PortCounters(**row) for port, row in values.items()}
