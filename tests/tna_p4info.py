"""The P4Info of p4src/tna/forgive.p4, for tests of the Tofino controller.

bf-p4c writes it (`make p4-tna`, committed in p4src/tna/build/TARGET/). Where
that file exists it is what `p4info(target)` returns. Until bf-p4c has run,
`stand_in(target)` builds the same control surface from the program's
declarations (names, match kinds, widths, action parameters, counters, the
selector), numbered the way P4Info numbers objects; test_tna_surface checks
that the two agree wherever both exist.
"""

from __future__ import annotations

from pathlib import Path

from p4.config.v1 import p4info_pb2

from controller.p4info import load_p4info

REPO = Path(__file__).resolve().parent.parent
MIRROR_ID_BITS = {"tofino": 10, "tofino2": 8}
"""MirrorId_t in tofino1_specs.p4 and tofino2_specs.p4."""

_Match = p4info_pb2.MatchField
_P = p4info_pb2.P4Ids
KEYLESS_SIZE = 1024
"""What p4c's P4Runtime serializer gives a table that declares no size."""

ACTIONS = {
    "ForgiveIngress.set_nhop": [("dmac", 48), ("port", 9)],
    "ForgiveIngress.set_ecmp_group": [("group_id", 16)],
    "ForgiveIngress.drop": [],
    "ForgiveIngress.set_trim_session": [("session", None)],
    "ForgiveIngress.disable_trim": [],
    "ForgiveEgress.mark_ce": [],
    "ForgiveEgress.set_trim_lengths": [("ipv4_total_len", 16), ("udp_len", 16)],
    "ForgiveEgress.set_trim_dscp": [("dscp", 6)],
    "NoAction": [],
}
TABLES = {
    "ForgiveIngress.ipv4_lpm": (
        [("hdr.ipv4.dstAddr", 32, _Match.LPM)],
        ["ForgiveIngress.set_nhop", "ForgiveIngress.set_ecmp_group", "ForgiveIngress.drop"],
        1024,
    ),
    "ForgiveIngress.ecmp_nhop": (
        [("meta.ecmp_group_id", 16, _Match.EXACT)],
        ["ForgiveIngress.set_nhop", "ForgiveIngress.drop"],
        1024,
    ),
    "ForgiveIngress.trim_sessions": (
        [("egress_port", 9, _Match.EXACT)],
        ["ForgiveIngress.set_trim_session", "NoAction"],
        512,
    ),
    "ForgiveIngress.trim_eligibility": (
        [("hdr.ipv4.dscp", 6, _Match.EXACT)],
        ["ForgiveIngress.disable_trim", "NoAction"],
        64,
    ),
    "ForgiveIngress.trim_acl": (
        [
            ("hdr.ipv4.srcAddr", 32, _Match.TERNARY),
            ("hdr.ipv4.dstAddr", 32, _Match.TERNARY),
            ("hdr.ipv4.dscp", 6, _Match.TERNARY),
        ],
        ["ForgiveIngress.disable_trim", "NoAction"],
        256,
    ),
    "ForgiveEgress.trim_lengths": (
        [],
        ["ForgiveEgress.set_trim_lengths", "NoAction"],
        KEYLESS_SIZE,
    ),
    "ForgiveEgress.trim_dscp": (
        [("egress_port", 9, _Match.EXACT)],
        ["ForgiveEgress.set_trim_dscp", "NoAction"],
        512,
    ),
    "ForgiveEgress.ecn_marking": (
        [
            ("egress_port", 9, _Match.EXACT),
            ("enq_qdepth", 19, _Match.RANGE),
            ("mark_draw", 16, _Match.RANGE),
        ],
        ["ForgiveEgress.mark_ce", "NoAction"],
        1152,
    ),
}
COUNTERS = {
    "ForgiveIngress.port_drops": p4info_pb2.CounterSpec.PACKETS,
    "ForgiveEgress.port_tx": p4info_pb2.CounterSpec.BOTH,
    "ForgiveEgress.port_ce_marks": p4info_pb2.CounterSpec.PACKETS,
    "ForgiveEgress.port_trims": p4info_pb2.CounterSpec.PACKETS,
    "ForgiveEgress.port_trim_tx": p4info_pb2.CounterSpec.PACKETS,
    "ForgiveEgress.port_drops": p4info_pb2.CounterSpec.PACKETS,
}
PROFILE = ("ForgiveIngress.ecmp_profile", 4096, 64, "ForgiveIngress.ecmp_nhop")


def committed(target: str) -> Path:
    return REPO / "p4src" / "tna" / "build" / target / "forgive.p4info.txtpb"


def stand_in(target: str) -> p4info_pb2.P4Info:
    info = p4info_pb2.P4Info()
    ids = {}
    for i, (name, params) in enumerate(ACTIONS.items(), 1):
        action = info.actions.add()
        action.preamble.id, action.preamble.name = (_P.ACTION << 24) | i, name
        ids[name] = action.preamble.id
        for j, (param, width) in enumerate(params, 1):
            action.params.add(id=j, name=param, bitwidth=width or MIRROR_ID_BITS[target])
    profile_id = (_P.ACTION_PROFILE << 24) | 1
    for i, (name, (fields, actions, size)) in enumerate(TABLES.items(), 1):
        table = info.tables.add(size=size)
        table.preamble.id, table.preamble.name = (_P.TABLE << 24) | i, name
        ids[name] = table.preamble.id
        for j, (field, width, kind) in enumerate(fields, 1):
            table.match_fields.add(id=j, name=field, bitwidth=width, match_type=kind)
        for action in actions:
            table.action_refs.add(id=ids[action])
        if name == PROFILE[3]:
            table.implementation_id = profile_id
    profile = info.action_profiles.add(
        with_selector=True, size=PROFILE[1], max_group_size=PROFILE[2]
    )
    profile.preamble.id, profile.preamble.name = profile_id, PROFILE[0]
    profile.table_ids.append(ids[PROFILE[3]])
    for i, (name, unit) in enumerate(COUNTERS.items(), 1):
        counter = info.counters.add(size=512)
        counter.preamble.id, counter.preamble.name = (_P.COUNTER << 24) | i, name
        counter.spec.unit = unit
    return info


def p4info(target: str) -> p4info_pb2.P4Info:
    """The compiled P4Info where bf-p4c's is committed, else the stand-in."""
    path = committed(target)
    return load_p4info(path) if path.is_file() else stand_in(target)


def surface(info: p4info_pb2.P4Info) -> dict:
    """What the controller relies on, by name: ids left out."""
    names = {a.preamble.id: a.preamble.name for a in info.actions}
    names.update({p.preamble.id: p.preamble.name for p in info.action_profiles})
    tables = {t.preamble.id: t.preamble.name for t in info.tables}
    return {
        "actions": {
            a.preamble.name: [(p.name, p.bitwidth) for p in a.params]
            for a in info.actions
            if a.preamble.name in ACTIONS
        },
        "tables": {
            t.preamble.name: (
                [(m.name, m.bitwidth, m.match_type) for m in t.match_fields],
                sorted(names[r.id] for r in t.action_refs),
                names.get(t.implementation_id),
            )
            for t in info.tables
        },
        "profiles": {
            p.preamble.name: (p.with_selector, p.max_group_size, [tables[t] for t in p.table_ids])
            for p in info.action_profiles
        },
        "counters": {c.preamble.name: (c.spec.unit, c.size) for c in info.counters},
    }
