"""The part of forgive.p4 the model implements, checked against a pushed P4Info.

The model knows its tables, actions and counters only by the names and shapes
agreed in TEAM.md and docs/dataplane.md; every numeric id it uses comes from
the P4Info that the controller pushes. A P4Info that renames, reshapes or adds
a table, a table's action or a counter is refused as a whole, so a P4 change
the model does not follow shows up as a failing SetForwardingPipelineConfig
instead of a silently wrong switch. Actions no table can run and registers
cannot be written over P4Runtime here, so they are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from p4.config.v1 import p4info_pb2

LPM_TABLE = "MyIngress.ipv4_lpm"
ECMP_TABLE = "MyIngress.ecmp_nhop"
THRESHOLD_TABLE = "MyIngress.port_thresholds"

SET_NHOP = "MyIngress.set_nhop"
SET_ECMP_GROUP = "MyIngress.set_ecmp_group"
DROP = "MyIngress.drop"
SET_THRESHOLDS = "MyIngress.set_thresholds"
NO_ACTION = "NoAction"

PORT_TX = "MyEgress.port_tx"
PORT_CE_MARKS = "MyIngress.port_ce_marks"
PORT_TRIMS = "MyIngress.port_trims"
PORT_DROPS = "MyIngress.port_drops"

_MT = p4info_pb2.MatchField
_CU = p4info_pb2.CounterSpec

TABLE_KEYS: dict[str, tuple[tuple[str, int, int], ...]] = {
    LPM_TABLE: (("hdr.ipv4.dstAddr", _MT.LPM, 32),),
    ECMP_TABLE: (("meta.ecmp_group_id", _MT.EXACT, 16), ("meta.ecmp_member", _MT.EXACT, 16)),
    THRESHOLD_TABLE: (("standard_metadata.egress_spec", _MT.EXACT, 9),),
}
"""Per table, its key fields in P4Info order: name, match type, bit width."""

TABLE_ACTIONS: dict[str, frozenset[str]] = {
    LPM_TABLE: frozenset({SET_NHOP, SET_ECMP_GROUP, DROP}),
    ECMP_TABLE: frozenset({SET_NHOP, DROP}),
    THRESHOLD_TABLE: frozenset({SET_THRESHOLDS}),
}
"""Actions an entry may use; NoAction may also appear on any table (p4c adds it)."""

ACTION_PARAMS: dict[str, tuple[tuple[str, int], ...]] = {
    SET_NHOP: (("dmac", 48), ("port", 9)),
    SET_ECMP_GROUP: (("group_id", 16), ("num_members", 16)),
    DROP: (),
    SET_THRESHOLDS: (
        ("data_queue_bytes", 32),
        ("ecn_kmin", 32),
        ("ecn_kmax", 32),
        ("ecn_pmax", 32),
    ),
    NO_ACTION: (),
}

COUNTER_UNITS: dict[str, int] = {
    PORT_TX: _CU.BOTH,
    PORT_CE_MARKS: _CU.PACKETS,
    PORT_TRIMS: _CU.PACKETS,
    PORT_DROPS: _CU.PACKETS,
}


class PipelineMismatch(ValueError):
    """The pushed P4Info describes a program the model does not implement."""


@dataclass(frozen=True)
class TableInfo:
    name: str
    id: int
    key: tuple[tuple[int, int, int], ...]
    """(field id, match type, bit width) in P4Info order."""
    actions: frozenset[int]
    const_default_action_id: int
    size: int


@dataclass(frozen=True)
class ActionInfo:
    name: str
    id: int
    params: tuple[tuple[int, int], ...]
    """(param id, bit width) in the order the model's code reads them."""


@dataclass(frozen=True)
class CounterInfo:
    name: str
    id: int
    size: int


@dataclass
class Pipeline:
    """A validated P4Info, with ids resolved to the model's names."""

    p4info: p4info_pb2.P4Info
    tables: dict[int, TableInfo] = field(default_factory=dict)
    actions: dict[int, ActionInfo] = field(default_factory=dict)
    counters: dict[int, CounterInfo] = field(default_factory=dict)
    table_ids: dict[str, int] = field(default_factory=dict)
    action_ids: dict[str, int] = field(default_factory=dict)
    counter_ids: dict[str, int] = field(default_factory=dict)


def load_pipeline(p4info: p4info_pb2.P4Info) -> Pipeline:
    """Check `p4info` against the implemented surface; raise PipelineMismatch listing every gap."""
    problems: list[str] = []
    pipe = Pipeline(p4info=p4info)
    referenced = {ref.id for table in p4info.tables for ref in table.action_refs}
    for action in p4info.actions:
        name = action.preamble.name
        if name not in ACTION_PARAMS:
            if action.preamble.id in referenced:
                problems.append(f"unknown action {name}")
            continue
        by_name = {p.name: p for p in action.params}
        expected = ACTION_PARAMS[name]
        if {p.name: p.bitwidth for p in action.params} != dict(expected):
            got = ", ".join(f"{p.name}:{p.bitwidth}" for p in action.params)
            want = ", ".join(f"{n}:{w}" for n, w in expected)
            problems.append(f"action {name} has params ({got}), expected ({want})")
            continue
        info = ActionInfo(name, action.preamble.id, tuple((by_name[n].id, w) for n, w in expected))
        pipe.actions[info.id] = info
        pipe.action_ids[name] = info.id
    for table in p4info.tables:
        name = table.preamble.name
        if name not in TABLE_KEYS:
            problems.append(f"unknown table {name}")
            continue
        key = tuple((m.name, m.match_type, m.bitwidth) for m in table.match_fields)
        if key != TABLE_KEYS[name]:
            problems.append(f"table {name} has key {key}, expected {TABLE_KEYS[name]}")
            continue
        refs = {r.id for r in table.action_refs}
        names = {pipe.actions[i].name for i in refs if i in pipe.actions}
        missing = TABLE_ACTIONS[name] - names
        extra = names - TABLE_ACTIONS[name] - {NO_ACTION}
        if missing or extra or len(names) != len(refs):
            problems.append(
                f"table {name} actions {sorted(names)}, expected {sorted(TABLE_ACTIONS[name])}"
            )
            continue
        info = TableInfo(
            name,
            table.preamble.id,
            tuple((m.id, m.match_type, m.bitwidth) for m in table.match_fields),
            frozenset(refs),
            table.const_default_action_id,
            table.size,
        )
        pipe.tables[info.id] = info
        pipe.table_ids[name] = info.id
    for counter in p4info.counters:
        name = counter.preamble.name
        if name not in COUNTER_UNITS:
            problems.append(f"unknown counter {name}")
            continue
        if counter.spec.unit != COUNTER_UNITS[name]:
            problems.append(f"counter {name} has unit {counter.spec.unit}")
            continue
        info = CounterInfo(name, counter.preamble.id, counter.size)
        pipe.counters[info.id] = info
        pipe.counter_ids[name] = info.id
    for kind, wanted, got in (
        ("table", TABLE_KEYS, pipe.table_ids),
        ("action", set(ACTION_PARAMS) - {NO_ACTION}, pipe.action_ids),
        ("counter", COUNTER_UNITS, pipe.counter_ids),
    ):
        problems.extend(f"missing {kind} {name}" for name in sorted(set(wanted) - set(got)))
    if problems:
        raise PipelineMismatch("; ".join(problems))
    return pipe
