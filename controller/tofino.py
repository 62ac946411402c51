"""The controller's Tofino target: p4src/tna/forgive.p4 on bf_switchd, from the same
fabric description as BMv2 and the model.

Over P4Runtime (bf_switchd's PI-based server) it installs, idempotently like
FabricController:

- routes in ForgiveIngress.ipv4_lpm; each ECMP group as a group of next-hop members
  of the ForgiveIngress.ecmp_profile selector, referenced from ForgiveIngress.ecmp_nhop;
- per managed port a clone session that carries trimmed headers back to the
  port, cut to the trim size, and its ForgiveIngress.trim_sessions entry;
- per managed port the RED ramp in ForgiveEgress.ecn_marking: per band of depths
  (TM cells), the random draws that mark;
- the description's trimming section (controller.trimming, parsed once for
  every target): the trimmed lengths in ForgiveEgress.trim_lengths, the trim
  DSCP in ForgiveEgress.trim_dscp, ineligible classes and DISABLE_TRIM rules in
  the tables the v1model program names alike.

What P4Runtime cannot set (queue priority, the data and trim queues' buffers,
the trim queue of a mirror session, port shaping, the deflection port)
`tm_config` returns as BF-RT operations on the fixed-function tables, for the
operator to apply (docs/tofino.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from p4.v1 import p4runtime_pb2

from common import p4names
from common.p4names import (
    ECMP_PROFILE,
    ECN_TABLE,
    EGRESS_PORT,
    ENQ_QDEPTH,
    MARK_CE,
    MARK_DRAW,
    SET_TRIM_LENGTHS,
    SET_TRIM_SESSION,
    TNA_PORT_CE_MARKS,
    TNA_PORT_EGRESS_DROPS,
    TNA_PORT_TRIM_TX,
    TNA_PORT_TRIMS,
    TNA_SET_TRIM_DSCP,
    TNA_TRIM_DSCP_TABLE,
    TRIM_LENGTHS_TABLE,
    TRIM_TABLE,
)
from common.wire import DATA_FRAME_LEN, ETH_LEN, IPV4_LEN, TRIMMED_FRAME_LEN
from controller import entries
from controller.fabric_control import ApplyReport, FabricController, eligibility_entries
from controller.p4info import ConfigError, P4InfoIndex, entry_action, entry_key
from controller.tofino_pipeline import CHIPS, Chip
from controller.topology import Fabric, NextHop, PortSpec, tofino_pipe
from controller.trimming import DSCP_FROM_TC, Trimming
from switch_model.port import PRIO_LOW
from switch_model.surface import PortCounters, Thresholds

TRIM_DSCP = entries.TrimDscpTable(TNA_TRIM_DSCP_TABLE, TNA_SET_TRIM_DSCP, EGRESS_PORT)
"""The per-port trim DSCP, applied as the trimmed header leaves its port."""
COUNTER_FIELDS: dict[str, tuple[str | None, str]] = {
    p4names.PORT_TX: ("tx_bytes", "tx_packets"),
    TNA_PORT_CE_MARKS: (None, "ce_marks"),
    TNA_PORT_TRIMS: (None, "trims"),
    TNA_PORT_TRIM_TX: (None, "trim_tx"),
    TNA_PORT_EGRESS_DROPS: (None, "drops"),
    p4names.PORT_DROPS: (None, "drops"),
}
"""As surface.COUNTER_FIELDS: drops are counted where they happen, malformed in
ingress and for want of room in egress, and add up. Trimmed but dropped has no
counter of its own (`with_trim_drops`)."""

QID_HIGH, QID_LOW = 0, 1
"""The program's queues (QID_HIGH, QID_LOW in p4src/tna/forgive.p4)."""
QID_TRIM = 2
"""The bounded trim queue: with trim_queue_bytes, trims go to a queue of their own at
the high queue's priority, its TM buffer the bound, so that no control packet is
dropped for it (docs/tofino.md)."""
MIRROR_CFG = "$mirror.cfg"
"""BF-RT's mirror session table, where a session's queue is set."""
ALL_PIPES = 0xFFFF
"""BF-RT's pipe id for a device-wide table."""
TRIM_MIRROR_BYTES = 6
"""The mirror header forgive.p4 puts in front of a trimmed copy (PREPENDED_BYTES);
a session's truncation length counts it."""
ECN_BANDS = 8
"""Steps of the RED ramp per port: each band's probability is the ramp's at the
band's middle, so no depth is off by more than pmax/16."""
QUEUE_DEPTH_BITS = 19
"""enq_qdepth in the egress intrinsic metadata."""
DEFLECT_QUEUE = QID_HIGH
"""The queue of the deflect port that deflected packets wait in."""

_Update = p4runtime_pb2.Update
_Entity = p4runtime_pb2.Entity
DRAW_TOP = 0xFFFF
"""The 16-bit draw's largest value."""


def cells(nbytes: int, chip: Chip) -> int:
    """A byte figure in TM cells, rounded up: a queue of N cells holds N * cell bytes."""
    return math.ceil(nbytes / chip.cell_bytes)


@dataclass(frozen=True)
class EcnBand:
    """Depths low..high (cells, inclusive) mark with probability threshold/65536,
    or always when threshold is None."""

    low: int
    high: int
    threshold: int | None

    def draws(self) -> tuple[int, int]:
        """The range of the 16-bit draw that marks (the table's mark_draw key)."""
        return (0, DRAW_TOP if self.threshold is None else self.threshold - 1)


def ecn_bands(thresholds: Thresholds, chip: Chip) -> list[EcnBand]:
    """docs/dataplane.md's marking rule in cells: certain from ecn_kmax, a ramp of
    ECN_BANDS steps up to pmax from ecn_kmin. Bands that would never mark are left out."""
    _, kmin_bytes, kmax_bytes, pmax = thresholds
    top = (1 << QUEUE_DEPTH_BITS) - 1
    kmin, kmax = (min(top, cells(n, chip)) for n in (kmin_bytes, kmax_bytes))
    bands = [EcnBand(kmax, top, None)]
    span = kmax - kmin
    steps = min(ECN_BANDS, span)
    for i in range(steps):
        low, high = kmin + span * i // steps, kmin + span * (i + 1) // steps - 1
        threshold = min(DRAW_TOP, pmax * (low + high - 2 * kmin) // (2 * span))
        if threshold > 0:
            bands.append(EcnBand(low, high, threshold))
    return bands


# -- entities, built once for the controller and the PTF suite ---------------------


def trim_queue(trimming: Trimming) -> int:
    """The qid trimmed headers wait in: SAI's trim queue index in the program's queues."""
    if trimming.queue_index == PRIO_LOW:
        return QID_LOW
    return QID_HIGH if trimming.trim_queue_bytes is None else QID_TRIM


def with_trim_drops(counters: PortCounters) -> PortCounters:
    """SAI's trimmed but dropped, for a program that counts only trimmed and trimmed and
    sent: the TM dropped the difference (exact once no trimmed header is in flight)."""
    return dataclasses.replace(counters, trim_drops=max(0, counters.trims - counters.trim_tx))


def session_ids(fabric: Fabric, switch: str) -> dict[int, int]:
    """Port -> the clone session carrying its trimmed headers: 1, 2, ... by port."""
    ports = sorted(port for name, port in fabric.ports if name == switch)
    return {port: i + 1 for i, port in enumerate(ports)}


def clone_session(port: int, session: int, size: int = TRIMMED_FRAME_LEN) -> p4runtime_pb2.Entity:
    """The session that carries `port`'s trimmed headers back to it, cut to `size` bytes."""
    clone = p4runtime_pb2.CloneSessionEntry(
        session_id=session,
        replicas=[p4runtime_pb2.Replica(egress_port=port, instance=0)],
        packet_length_bytes=TRIM_MIRROR_BYTES + size,
    )
    return _Entity(
        packet_replication_engine_entry=p4runtime_pb2.PacketReplicationEngineEntry(
            clone_session_entry=clone
        )
    )


def trim_lengths(index: P4InfoIndex, size: int) -> p4runtime_pb2.TableEntry:
    """trim_lengths' default entry: the IPv4 and UDP lengths of a packet cut to `size`
    bytes, or NoAction for the program's own 58."""
    if size == TRIMMED_FRAME_LEN:
        return index.default_entry(TRIM_LENGTHS_TABLE, p4names.NO_ACTION)
    lengths = {"ipv4_total_len": size - ETH_LEN, "udp_len": size - ETH_LEN - IPV4_LEN}
    return index.default_entry(TRIM_LENGTHS_TABLE, SET_TRIM_LENGTHS, lengths)


def trim_defaults(index: P4InfoIndex, trimming: Trimming) -> list[p4runtime_pb2.TableEntry]:
    """The default entries the trimming section sets: the trimmed lengths, the one DSCP."""
    return [
        trim_lengths(index, trimming.size),
        entries.trim_dscp_default(index, trimming.static_dscp, TRIM_DSCP),
    ]


def trim_session(index: P4InfoIndex, port: int, session: int) -> p4runtime_pb2.TableEntry:
    """Makes `port` managed: the TM deflects what its data queue cannot hold."""
    return index.table_entry(
        TRIM_TABLE, {EGRESS_PORT: port}, SET_TRIM_SESSION, {"session": session}
    )


def ecn_entries(
    index: P4InfoIndex, port: int, thresholds: Thresholds, chip: Chip
) -> list[p4runtime_pb2.TableEntry]:
    """`port`'s RED ramp: per band of depths, the draws that mark."""
    return [
        index.table_entry(
            ECN_TABLE,
            {EGRESS_PORT: port, ENQ_QDEPTH: (band.low, band.high), MARK_DRAW: band.draws()},
            MARK_CE,
            {},
            priority=1,
        )
        for band in ecn_bands(thresholds, chip)
    ]


def ecmp_profile(index: P4InfoIndex):
    for profile in index.p4info.action_profiles:
        if profile.preamble.name == ECMP_PROFILE:
            return profile
    raise ConfigError(f"P4Info has no action profile {ECMP_PROFILE}")


def ecmp_member(index: P4InfoIndex, member: int, dmac: int, port: int) -> p4runtime_pb2.Entity:
    """Member `member` of the ECMP selector: one next hop."""
    return _Entity(
        action_profile_member=p4runtime_pb2.ActionProfileMember(
            action_profile_id=ecmp_profile(index).preamble.id,
            member_id=member,
            action=index.action(p4names.SET_NHOP, {"dmac": dmac, "port": port}),
        )
    )


def ecmp_group(
    index: P4InfoIndex, group: int, members: Iterable[int]
) -> list[p4runtime_pb2.Entity]:
    """ECMP group `group` of the given members, and the ecmp_nhop entry that uses it."""
    profile = ecmp_profile(index)
    entity = _Entity(
        action_profile_group=p4runtime_pb2.ActionProfileGroup(
            action_profile_id=profile.preamble.id, group_id=group, max_size=profile.max_group_size
        )
    )
    for member in members:
        entity.action_profile_group.members.add(member_id=member, weight=1)
    nhop = index.table_entry(p4names.ECMP_TABLE, {p4names.ECMP_GROUP_ID: group}, None, {})
    nhop.action.action_profile_group_id = group
    return [entity, _Entity(table_entry=nhop)]


def ecmp_route(index: P4InfoIndex, prefix: int, prefix_len: int, group: int):
    """`prefix/prefix_len` to ECMP group `group` (the selector knows its size)."""
    return index.table_entry(
        p4names.LPM_TABLE,
        {p4names.DST_ADDR: (prefix, prefix_len)},
        p4names.SET_ECMP_GROUP,
        {"group_id": group},
    )


@dataclass
class SwitchEntities:
    """What one switch should hold, by kind, each keyed by its P4Runtime identity."""

    members: dict = field(default_factory=dict)
    groups: dict = field(default_factory=dict)
    sessions: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)
    routes: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    """Table id -> its default entry, which is modified, never inserted or deleted."""

    def phases(self) -> list[dict]:
        """Insertion order: a member before the groups holding it, a group or session
        before the entries referring to it, next hops before the routes to them."""
        return [self.members, self.groups, self.sessions, self.tables, self.routes]


def _action_identity(action: p4runtime_pb2.TableAction) -> tuple:
    kind = action.WhichOneof("type")
    if kind == "action_profile_group_id":
        return ("group", action.action_profile_group_id)
    if kind == "action_profile_member_id":
        return ("member", action.action_profile_member_id)
    return entry_action(p4runtime_pb2.TableEntry(action=action))


def identity(entity: p4runtime_pb2.Entity) -> tuple:
    """(key, content): what names an entity and what a MODIFY would change, both
    independent of how the switch pads byte strings."""
    kind = entity.WhichOneof("entity")
    if kind == "table_entry":
        entry = entity.table_entry
        return entry_key(entry), _action_identity(entry.action)
    if kind == "action_profile_member":
        member = entity.action_profile_member
        holder = p4runtime_pb2.TableEntry(action=p4runtime_pb2.TableAction(action=member.action))
        content = entry_action(holder)
        return ("member", member.action_profile_id, member.member_id), content
    if kind == "action_profile_group":
        group = entity.action_profile_group
        members = sorted((m.member_id, m.weight or 1) for m in group.members)
        return ("group", group.action_profile_id, group.group_id), tuple(members)
    session = entity.packet_replication_engine_entry.clone_session_entry
    replicas = sorted((r.egress_port, r.instance) for r in session.replicas)
    return ("session", session.session_id), (tuple(replicas), session.packet_length_bytes)


def _keyed(entities: Iterable[p4runtime_pb2.Entity]) -> dict:
    return {identity(e)[0]: e for e in entities}


def _key_only(entity: p4runtime_pb2.Entity) -> p4runtime_pb2.Entity:
    """The entity as a DELETE names it."""
    out = _Entity()
    out.CopyFrom(entity)
    kind = out.WhichOneof("entity")
    if kind == "table_entry":
        out.table_entry.ClearField("action")
    elif kind == "action_profile_member":
        out.action_profile_member.ClearField("action")
    elif kind == "action_profile_group":
        out.action_profile_group.ClearField("members")
    else:
        out.packet_replication_engine_entry.clone_session_entry.ClearField("replicas")
    return out


def plan(wanted: SwitchEntities, installed: SwitchEntities) -> tuple[list[list], dict[str, int]]:
    """Batches of updates, to be written one after another, taking `installed` to
    `wanted`: inserts and modifies in dependency order, then deletes in reverse, then
    the default entries that differ."""
    batches: list[list] = []
    counts = {"inserted": 0, "modified": 0, "deleted": 0}
    for want, have in zip(wanted.phases(), installed.phases(), strict=True):
        batch = []
        for key, entity in want.items():
            if key not in have:
                kind, counts["inserted"] = _Update.INSERT, counts["inserted"] + 1
            elif identity(have[key])[1] != identity(entity)[1]:
                kind, counts["modified"] = _Update.MODIFY, counts["modified"] + 1
            else:
                continue
            batch.append(_Update(type=kind, entity=entity))
        batches.append(batch)
    for want, have in reversed(list(zip(wanted.phases(), installed.phases(), strict=True))):
        stale = [
            _Update(type=_Update.DELETE, entity=_key_only(e))
            for k, e in have.items()
            if k not in want
        ]
        counts["deleted"] += len(stale)
        batches.append(stale)
    defaults = []
    for table_id, entity in wanted.defaults.items():
        have = installed.defaults.get(table_id)
        if have is None or identity(have)[1] != identity(entity)[1]:
            defaults.append(_Update(type=_Update.MODIFY, entity=entity))
    counts["modified"] += len(defaults)
    batches.append(defaults)
    return [b for b in batches if b], counts


class TofinoFabricController(FabricController):
    """FabricController for a fabric of Tofino switches of one generation.

    `p4info_path` and `device_config_path` are one target's P4Info and device
    config (controller.tofino_pipeline: `make p4-tna` builds them)."""

    def __init__(self, fabric: Fabric, p4info_path, device_config_path, tls=None):
        targets = {spec.target for spec in fabric.switches.values()}
        if len(targets) != 1 or not targets <= set(CHIPS):
            raise ConfigError(f"a Tofino controller drives one Tofino kind, got {sorted(targets)}")
        self.chip = CHIPS[targets.pop()]
        super().__init__(fabric, p4info_path, device_config_path, tls)

    def table_entries(self, switch: str) -> list[p4runtime_pb2.TableEntry]:
        wanted = self.wanted[switch]
        return [e.table_entry for into in (wanted.tables, wanted.routes) for e in into.values()]

    def connect(self, write: bool = True) -> None:
        """Reach every switch (as primary to write); the TM is set apart (tm_config), so
        there is no shaping channel to check."""
        for client in self.clients.values():
            client.connect(primary=write)

    def _ports(self, switch: str) -> dict[int, PortSpec]:
        return {p: spec for (name, p), spec in sorted(self.fabric.ports.items()) if name == switch}

    def trim_sessions(self, switch: str) -> dict[int, int]:
        """Port -> the clone session carrying its trimmed headers (`session_ids`), checked
        against the width of the program's session ids."""
        sessions = session_ids(self.fabric, switch)
        action = self.index.actions.get(SET_TRIM_SESSION)
        if action is None:
            raise ConfigError(f"P4Info has no action {SET_TRIM_SESSION}")
        width = action.params[0].bitwidth
        if len(sessions) >= 1 << width:
            raise ConfigError(
                f"switch {switch}: {len(sessions)} managed ports, but mirror session ids have "
                f"{width} bits"
            )
        return sessions

    def entries(self, switch: str) -> SwitchEntities:
        index = self.index
        wanted = SwitchEntities()

        def put(into: dict, entity: p4runtime_pb2.Entity) -> None:
            into[identity(entity)[0]] = entity

        trimming = self.fabric.trimming
        for port, session in self.trim_sessions(switch).items():
            put(wanted.sessions, clone_session(port, session, trimming.size))
            put(wanted.tables, _Entity(table_entry=trim_session(index, port, session)))
        for port, spec in self._ports(switch).items():
            for entry in ecn_entries(index, port, spec.thresholds, self.chip):
                put(wanted.tables, _Entity(table_entry=entry))
            if trimming.dscp_value == DSCP_FROM_TC:
                dscp = self.fabric.trim_dscp(switch, port)
                put(
                    wanted.tables,
                    _Entity(table_entry=entries.trim_dscp(index, port, dscp, TRIM_DSCP)),
                )
        for entry in eligibility_entries(trimming, index):
            put(wanted.tables, _Entity(table_entry=entry))
        for entry in trim_defaults(index, trimming):
            wanted.defaults[entry.table_id] = _Entity(table_entry=entry)

        profile = ecmp_profile(index)
        members: dict[NextHop, int] = {}
        groups: dict[tuple[NextHop, ...], int] = {}
        for ip, hops in sorted(self.fabric.routes(switch).items()):
            if not hops:
                continue
            if len(hops) == 1:
                route = entries.route(index, ip, 32, hops[0].dmac, hops[0].port)
                put(wanted.routes, _Entity(table_entry=route))
                continue
            if len(hops) > profile.max_group_size > 0:
                raise ConfigError(
                    f"switch {switch}: {len(hops)} equal-cost next hops exceed the selector's "
                    f"{profile.max_group_size}"
                )
            group = groups.get(tuple(hops))
            if group is None:
                group = groups[tuple(hops)] = len(groups) + 1
                for hop in hops:
                    if hop not in members:
                        members[hop] = len(members) + 1
                        put(wanted.members, ecmp_member(index, members[hop], hop.dmac, hop.port))
                group_entity, nhop = ecmp_group(index, group, (members[h] for h in hops))
                put(wanted.groups, group_entity)
                put(wanted.tables, nhop)
            put(wanted.routes, _Entity(table_entry=ecmp_route(index, ip, 32, group)))
        self._check_sizes(switch, wanted)
        return wanted

    def _check_sizes(self, switch: str, wanted: SwitchEntities) -> None:
        """Refuse, before any write, more entries than a table holds."""
        held: dict[int, int] = {}
        for entity in [*wanted.tables.values(), *wanted.routes.values()]:
            held[entity.table_entry.table_id] = held.get(entity.table_entry.table_id, 0) + 1
        for table in self.p4info.tables:
            if held.get(table.preamble.id, 0) > table.size > 0:
                raise ConfigError(
                    f"switch {switch}: {held[table.preamble.id]} entries for "
                    f"{table.preamble.name}, which holds {table.size}"
                )

    def _installed(self, switch: str) -> SwitchEntities:
        client = self.clients[switch]
        profile_id = ecmp_profile(self.index).preamble.id
        names = (
            TRIM_TABLE,
            ECN_TABLE,
            TRIM_DSCP.table,
            p4names.TRIM_ELIGIBILITY_TABLE,
            p4names.TRIM_ACL_TABLE,
            p4names.ECMP_TABLE,
        )
        tables = [self.index.table_id(t) for t in names]
        clone_query = p4runtime_pb2.PacketReplicationEngineEntry(
            clone_session_entry=p4runtime_pb2.CloneSessionEntry()
        )
        member_query = p4runtime_pb2.ActionProfileMember(action_profile_id=profile_id)
        group_query = p4runtime_pb2.ActionProfileGroup(action_profile_id=profile_id)
        lpm = self.index.table_id(p4names.LPM_TABLE)

        def read(*queries: p4runtime_pb2.Entity) -> dict:
            return _keyed(client.read(list(queries)))

        defaults = {}
        for table_id in self.wanted[switch].defaults:
            query = p4runtime_pb2.TableEntry(table_id=table_id, is_default_action=True)
            found = list(client.read([_Entity(table_entry=query)]))
            if found:
                defaults[table_id] = found[0]
            else:
                # as the program declares it: every default_action here is NoAction
                entry = p4runtime_pb2.TableEntry(table_id=table_id, is_default_action=True)
                entry.action.action.action_id = self.index.actions[p4names.NO_ACTION].preamble.id
                defaults[table_id] = _Entity(table_entry=entry)

        return SwitchEntities(
            members=read(_Entity(action_profile_member=member_query)),
            groups=read(_Entity(action_profile_group=group_query)),
            sessions=read(_Entity(packet_replication_engine_entry=clone_query)),
            tables=read(
                *(_Entity(table_entry=p4runtime_pb2.TableEntry(table_id=t)) for t in tables)
            ),
            routes=read(_Entity(table_entry=p4runtime_pb2.TableEntry(table_id=lpm))),
            defaults=defaults,
        )

    def apply_switch(self, switch: str) -> ApplyReport:
        client = self.clients[switch]
        pushed = self._sync_pipeline(client)
        batches, counts = plan(self.wanted[switch], self._installed(switch))
        for batch in batches:
            client.write(batch)
        return ApplyReport(pushed, **counts)

    def counters(self, switch: str) -> dict[int, PortCounters]:
        """Per port of `switch` on a link: what its counters hold, drops added up."""
        rows = entries.read_port_counters(
            self.clients[switch], self.index, self._ports(switch), COUNTER_FIELDS
        )
        return {port: with_trim_drops(row) for port, row in rows.items()}

    def tm_config(self, switch: str) -> dict:
        """The BF-RT operations that give `switch` its queues: JSON-ready data."""
        return tm_config(self.fabric, switch, self.chip)


def _op(chip: Chip, table: str, pipe: int, data: dict, **where) -> dict:
    return {"table": f"{chip.bfrt_prefix}.tm.{table}", "pipe": pipe, **where, "data": data}


def tm_config(fabric: Fabric, switch: str, chip: Chip) -> dict:
    """BF-RT settings of the fixed-function TM tables for one switch, as data.

    Each operation names its table and the pipe (the dev_tgt pipe_id) and then
    either "key" (tableEntryMod of that entry), "queue" (the same for a queue,
    named by dev_port and qid: BF-RT keys queues by port group, and
    tm.port.cfg[dev_port] gives pg_id and, at egress_qid_queues[qid], pg_queue)
    or neither (tableDefaultEntrySet, for per-pipe tables); "action" where the
    table has actions. controller.bfrt_tm applies them.

    The trimming section adds: the trim queue of every trim session where it is not
    qid 0 (BF-RT's $mirror.cfg, the whole session restated), and with trim_queue_bytes
    the bounded trim queue's priority and buffer."""
    spec = fabric.switches[switch]
    trimming = fabric.trimming
    trim_qid = trim_queue(trimming)
    sessions = session_ids(fabric, switch)
    ops = [
        _op(
            chip,
            "pipe.cfg",
            tofino_pipe(port),
            {"mirror_drop_dev_port": port, "mirror_drop_queue_nr": DEFLECT_QUEUE},
        )
        for port in sorted(spec.deflect_ports)
    ]
    for (name, port), port_spec in sorted(fabric.ports.items()):
        if name != switch:
            continue
        pipe = tofino_pipe(port)

        def queue(qid: int, port: int = port) -> dict:
            return {"dev_port": port, "qid": qid}

        ops.append(
            _op(chip, "queue.sched_cfg", pipe, {"max_priority": "HIGH"}, queue=queue(QID_HIGH))
        )
        ops.append(
            _op(chip, "queue.sched_cfg", pipe, {"max_priority": "LOW"}, queue=queue(QID_LOW))
        )
        buffers = [(QID_LOW, port_spec.thresholds[0]), (QID_HIGH, port_spec.high_queue_bytes)]
        ops += [queue_buffer(chip, port, qid, n) for qid, n in buffers if n is not None]
        ops += trim_queue_ops(
            chip, port, sessions[port], trimming.size, trim_qid, trimming.trim_queue_bytes
        )
        if port_spec.rate_bps is not None:
            shaping = {
                "unit": "BPS",
                "provisioning": "UPPER",
                "max_rate": max(1, port_spec.rate_bps // 1000),
                "max_burst_size": 2 * DATA_FRAME_LEN,
            }
            ops.append(_op(chip, "port.sched_shaping", pipe, shaping, key={"dev_port": port}))
            ops.append(
                _op(chip, "port.sched_cfg", pipe, {"max_rate_enable": True}, key={"dev_port": port})
            )
    return {"switch": switch, "chip": chip.name, "cell_bytes": chip.cell_bytes, "operations": ops}


def queue_buffer(chip: Chip, port: int, qid: int, nbytes: int) -> dict:
    """Queue `qid` of `port` holds `nbytes` (in whole cells) and tail-drops past them."""
    data = {"guaranteed_cells": cells(nbytes, chip), "tail_drop_enable": True}
    queue = {"dev_port": port, "qid": qid}
    return _op(chip, "queue.buffer", tofino_pipe(port), data, queue=queue, action="buffer_only")


def trim_queue_ops(
    chip: Chip, port: int, session: int, size: int, qid: int, trim_queue_bytes: int | None
) -> list[dict]:
    """The BF-RT operations that send `port`'s trims (its session `session`, cutting at
    `size`) to queue `qid`; for QID_TRIM also that queue's priority and its bound."""
    ops = []
    if qid == QID_TRIM:
        queue = {"dev_port": port, "qid": QID_TRIM}
        high = {"max_priority": "HIGH"}
        ops.append(_op(chip, "queue.sched_cfg", tofino_pipe(port), high, queue=queue))
        ops.append(queue_buffer(chip, port, QID_TRIM, trim_queue_bytes))
    if qid != QID_HIGH:
        ops.append(mirror_queue(port, session, size, qid))
    return ops


def mirror_queue(port: int, session: int, size: int, qid: int) -> dict:
    """Trim session `session` (of `port`, cutting at `size`) as BF-RT's $mirror.cfg holds
    it, sending to queue `qid`: P4Runtime's clone sessions cannot name a queue."""
    data = {
        "$session_enable": True,
        "$direction": "BOTH",
        "$ucast_egress_port": port,
        "$ucast_egress_port_valid": True,
        "$egress_port_queue": qid,
        "$max_pkt_len": TRIM_MIRROR_BYTES + size,
    }
    return {
        "table": MIRROR_CFG,
        "pipe": ALL_PIPES,
        "key": {"$sid": session},
        "action": "$normal",
        "data": data,
    }


def controller_for(fabric: Fabric) -> Callable[..., FabricController]:
    """The controller class a fabric's switches need."""
    kinds = {spec.target for spec in fabric.switches.values()}
    return TofinoFabricController if kinds <= set(CHIPS) else FabricController
