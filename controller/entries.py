"""forgive.p4's table entries and port counters, spelled once by the surface's names.

The controller, the PTF suite, the tests and the benchmarks install the same
few kinds of entry (a route, an ECMP group and its members, a port's
thresholds) and read the same counters; they all build them here, so a name
or a parameter changes in one place.
"""

from __future__ import annotations

from collections.abc import Iterable

from p4.v1 import p4runtime_pb2

from controller.client import SwitchClient
from controller.p4info import P4InfoIndex
from switch_model import surface
from switch_model.surface import PortCounters, Thresholds


def route(index: P4InfoIndex, prefix: int, prefix_len: int, dmac: int, port: int):
    """`prefix/prefix_len` straight to one next hop."""
    return index.table_entry(
        surface.LPM_TABLE,
        {surface.DST_ADDR: (prefix, prefix_len)},
        surface.SET_NHOP,
        {"dmac": dmac, "port": port},
    )


def ecmp_route(index: P4InfoIndex, prefix: int, prefix_len: int, group: int, members: int):
    """`prefix/prefix_len` to ECMP group `group` of `members` members."""
    return index.table_entry(
        surface.LPM_TABLE,
        {surface.DST_ADDR: (prefix, prefix_len)},
        surface.SET_ECMP_GROUP,
        {"group_id": group, "num_members": members},
    )


def ecmp_member(index: P4InfoIndex, group: int, member: int, dmac: int, port: int):
    """Member `member` (0-based) of ECMP group `group`: one next hop."""
    return index.table_entry(
        surface.ECMP_TABLE,
        {surface.ECMP_GROUP_ID: group, surface.ECMP_MEMBER: member},
        surface.SET_NHOP,
        {"dmac": dmac, "port": port},
    )


def port_thresholds(index: P4InfoIndex, port: int, thresholds: Thresholds):
    """Makes `port` a managed port with these admission limits."""
    return index.table_entry(
        surface.THRESHOLD_TABLE,
        {surface.EGRESS_SPEC: port},
        surface.SET_THRESHOLDS,
        thresholds._asdict(),
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
