"""forgive.p4's control surface: the shapes of what a controller, a test or the model names.

The P4 program's tables, actions, counters and registers, named once in
common.p4names, with the shapes the model implements (key fields, action parameters, counter
units), and so are the values that cross the surface: a port's `Thresholds`,
the switch's `SwitchTrimming` and a port's `PortCounters`. The controller, the PTF suite and
the switch model all import them from here; docs/dataplane.md describes them.

`load_pipeline` checks a pushed P4Info against this surface. The model knows
the program only by these names and shapes, and every numeric id it uses comes
from the P4Info the controller pushes. A P4Info that renames, reshapes or adds
a table, a table's action or a counter is refused as a whole, so a P4 change
the model does not follow shows up as a failing SetForwardingPipelineConfig
instead of a silently wrong switch. Actions no table can run and registers
cannot be written over P4Runtime here, so they are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import NamedTuple

from p4.config.v1 import p4info_pb2

from common.p4names import (
    CONTROL_QUEUE_TABLE,
    DISABLE_TRIM,
    DROP,
    DSCP,
    DST_ADDR,
    ECMP_GROUP_ID,
    ECMP_MEMBER,
    ECMP_TABLE,
    EGRESS_SPEC,
    FTH_OPCODE,
    LPM_TABLE,
    NO_ACTION,
    PORT_CE_MARKS,
    PORT_DROPS,
    PORT_TRIM_DROPS,
    PORT_TRIM_TX,
    PORT_TRIMS,
    PORT_TX,
    QUEUE_WITH_DATA,
    SET_ECMP_GROUP,
    SET_NHOP,
    SET_SWITCH_TRIMMING,
    SET_THRESHOLDS,
    SET_TRIM_DSCP,
    SET_TRIM_QUEUE_BYTES,
    SRC_ADDR,
    SWITCH_TRIMMING_TABLE,
    THRESHOLD_TABLE,
    TRIM_ACL_TABLE,
    TRIM_DSCP_TABLE,
    TRIM_ELIGIBILITY_TABLE,
    TRIM_QUEUE_TABLE,
)
from common.wire import TRIMMED_FRAME_LEN
from switch_model.port import PRIO_HIGH

PMAX_ONE = 1 << 16
"""`ecn_pmax` of certain marking: the probability is in units of 1/65536."""


class Thresholds(NamedTuple):
    """One managed port's admission limits, the parameters of `set_thresholds` in order.

    Bytes are of frames as received (Ethernet header included, no FCS). A
    tuple, so the packet loop reads it by position as cheaply as before."""

    data_queue_bytes: int
    ecn_kmin: int
    ecn_kmax: int
    ecn_pmax: int
    """Marking probability at ecn_kmax in units of 1/65536 (PMAX_ONE = certain)."""


class SwitchTrimming(NamedTuple):
    """The parameters of `set_switch_trimming`: SAI's switch-wide trim size (bytes of the
    frame a trim keeps) and trim queue index (PRIO_LOW or PRIO_HIGH)."""

    size: int
    queue_index: int


DEFAULT_TRIMMING = SwitchTrimming(TRIMMED_FRAME_LEN, PRIO_HIGH)
"""What a trim does while switch_trimming runs NoAction: the program sets these first."""


@dataclass(frozen=True)
class PortCounters:
    """What the program's counters hold for one egress port; sums add field by field.

    The trim counters have SAI's meanings: `trims` every packet trimmed, `trim_tx` those
    the trim queue took, `trim_drops` those it had no room for (trimmed but dropped).
    `drops` counts packets dropped whole, never a trimmed one."""

    tx_packets: int = 0
    tx_bytes: int = 0
    ce_marks: int = 0
    trims: int = 0
    drops: int = 0
    trim_tx: int = 0
    trim_drops: int = 0

    def __add__(self, other: PortCounters) -> PortCounters:
        return PortCounters(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(PortCounters))
        )


COUNTER_FIELDS: dict[str, tuple[str | None, str]] = {
    PORT_TX: ("tx_bytes", "tx_packets"),
    PORT_CE_MARKS: (None, "ce_marks"),
    PORT_TRIMS: (None, "trims"),
    PORT_TRIM_TX: (None, "trim_tx"),
    PORT_TRIM_DROPS: (None, "trim_drops"),
    PORT_DROPS: (None, "drops"),
}
"""Per counter, the PortCounters fields its byte and packet counts fill (None: not counted)."""

_MT = p4info_pb2.MatchField
_CU = p4info_pb2.CounterSpec

TABLE_KEYS: dict[str, tuple[tuple[str, int, int], ...]] = {
    LPM_TABLE: ((DST_ADDR, _MT.LPM, 32),),
    ECMP_TABLE: ((ECMP_GROUP_ID, _MT.EXACT, 16), (ECMP_MEMBER, _MT.EXACT, 16)),
    THRESHOLD_TABLE: ((EGRESS_SPEC, _MT.EXACT, 9),),
    SWITCH_TRIMMING_TABLE: (),
    TRIM_ELIGIBILITY_TABLE: ((DSCP, _MT.EXACT, 6),),
    TRIM_ACL_TABLE: (
        (SRC_ADDR, _MT.TERNARY, 32),
        (DST_ADDR, _MT.TERNARY, 32),
        (DSCP, _MT.TERNARY, 6),
    ),
    TRIM_DSCP_TABLE: ((EGRESS_SPEC, _MT.EXACT, 9),),
    TRIM_QUEUE_TABLE: ((EGRESS_SPEC, _MT.EXACT, 9),),
    CONTROL_QUEUE_TABLE: ((FTH_OPCODE, _MT.EXACT, 4),),
}
"""Per table, its key fields in P4Info order: name, match type, bit width."""

TABLE_ACTIONS: dict[str, frozenset[str]] = {
    LPM_TABLE: frozenset({SET_NHOP, SET_ECMP_GROUP, DROP}),
    ECMP_TABLE: frozenset({SET_NHOP, DROP}),
    THRESHOLD_TABLE: frozenset({SET_THRESHOLDS}),
    SWITCH_TRIMMING_TABLE: frozenset({SET_SWITCH_TRIMMING}),
    TRIM_ELIGIBILITY_TABLE: frozenset({DISABLE_TRIM}),
    TRIM_ACL_TABLE: frozenset({DISABLE_TRIM}),
    TRIM_DSCP_TABLE: frozenset({SET_TRIM_DSCP}),
    TRIM_QUEUE_TABLE: frozenset({SET_TRIM_QUEUE_BYTES}),
    CONTROL_QUEUE_TABLE: frozenset({QUEUE_WITH_DATA}),
}
"""Actions an entry may use; NoAction may also appear on any table (p4c adds it)."""

ACTION_PARAMS: dict[str, tuple[tuple[str, int], ...]] = {
    SET_NHOP: (("dmac", 48), ("port", 9)),
    SET_ECMP_GROUP: (("group_id", 16), ("num_members", 16)),
    DROP: (),
    SET_THRESHOLDS: tuple((name, 32) for name in Thresholds._fields),
    SET_SWITCH_TRIMMING: tuple(zip(SwitchTrimming._fields, (32, 3), strict=True)),
    DISABLE_TRIM: (),
    SET_TRIM_DSCP: (("dscp", 6),),
    SET_TRIM_QUEUE_BYTES: (("trim_queue_bytes", 32),),
    QUEUE_WITH_DATA: (),
    NO_ACTION: (),
}

COUNTER_UNITS: dict[str, int] = {
    PORT_TX: _CU.BOTH,
    PORT_CE_MARKS: _CU.PACKETS,
    PORT_TRIMS: _CU.PACKETS,
    PORT_TRIM_TX: _CU.PACKETS,
    PORT_TRIM_DROPS: _CU.PACKETS,
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
