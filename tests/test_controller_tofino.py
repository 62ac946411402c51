"""The controller's Tofino target: what it computes, and what it writes to a
P4Runtime server that holds entities the way a switch must (p4rt_store)."""

from __future__ import annotations

import itertools
import json
import struct

import pytest
from google.protobuf import text_format
from hypothesis import given
from hypothesis import strategies as st
from p4rt_store import Store, serve
from tna_p4info import committed, p4info, stand_in, surface

from commands import ctl as cli
from common.p4names import ECN_TABLE, SET_TRIM_LENGTHS, TRIM_LENGTHS_TABLE
from common.wire import TRIMMED_FRAME_LEN
from controller.p4info import ConfigError, load_p4info
from controller.tofino import (
    ALL_PIPES,
    ECN_BANDS,
    MIRROR_CFG,
    QID_HIGH,
    QID_LOW,
    QID_TRIM,
    TRIM_DSCP,
    TRIM_MIRROR_BYTES,
    TofinoFabricController,
    cells,
    ecn_bands,
    tm_config,
    trim_queue,
    with_trim_drops,
)
from controller.tofino_pipeline import CHIPS, device_data
from controller.topology import parse
from switch_model.surface import PortCounters

TOFINO = CHIPS["tofino"]
H1, H2 = "02:00:00:00:01:01", "02:00:00:00:02:02"
FRAME = 4154
THRESHOLDS = {"data_queue_bytes": 40 * FRAME, "ecn_kmin": 8 * FRAME, "ecn_kmax": 24 * FRAME}


def description(s1: str, s2: str, target: str = "tofino", **extra) -> dict:
    """h1 - s1 =2 links= s2 - h2, as test_controller's fabric, on Tofino."""
    return {
        "switches": {
            "s1": {"target": target, "grpc": s1, "device_id": 0, "deflect_ports": [60]},
            "s2": {"target": target, "grpc": s2, "device_id": 0, "deflect_ports": [60]},
        },
        "hosts": {"h1": {"ip": "10.0.1.1", "mac": H1}, "h2": {"ip": "10.0.2.2", "mac": H2}},
        "links": [
            {"a": "h1", "b": "s1:1", "rate_bps": 10_000_000_000},
            {"a": "s1:2", "b": "s2:1"},
            {"a": "s1:3", "b": "s2:2"},
            {"a": "s2:3", "b": "h2"},
        ],
        "thresholds": THRESHOLDS,
        **extra,
    }


# -- the numbers ----------------------------------------------------------------------


def test_cells_round_up() -> None:
    assert [cells(n, TOFINO) for n in (0, 1, 80, 81, 4154)] == [0, 1, 1, 2, 52]
    assert cells(4154, CHIPS["tofino2"]) == 24


@given(
    st.integers(0, 2_000_000),
    st.integers(0, 2_000_000),
    st.integers(0, 1 << 16),
    st.sampled_from(sorted(CHIPS)),
)
def test_ecn_bands_follow_the_red_ramp(kmin: int, span: int, pmax: int, chip_name: str) -> None:
    """Below ecn_kmin nothing marks, from ecn_kmax everything does, and in between
    every depth marks with the ramp's probability to within pmax/16."""
    chip = CHIPS[chip_name]
    bands = ecn_bands((0, kmin, kmin + span, pmax), chip)
    lo, hi = cells(kmin, chip), cells(kmin + span, chip)
    assert len(bands) <= 1 + ECN_BANDS
    ordered = sorted(bands, key=lambda b: b.low)
    for a, b in itertools.pairwise(ordered):
        assert a.high < b.low, "bands overlap"

    def threshold(depth: int) -> int | None:
        found = [b.threshold for b in bands if b.low <= depth <= b.high]
        return found[0] if found else 0

    for depth in {0, max(0, lo - 1), hi, (1 << 19) - 1}:
        if depth >= hi:
            assert threshold(depth) is None
        elif depth < lo:
            assert threshold(depth) == 0
    for depth in range(lo, hi, max(1, (hi - lo) // 200)):
        # docs/dataplane.md: pmax/65536 * (occ - kmin) / (kmax - kmin)
        exact = pmax * (depth - lo) / (hi - lo)
        assert abs(threshold(depth) - exact) <= pmax / (2 * ECN_BANDS) + 1


def test_a_step_and_no_probability_leave_only_the_certain_band() -> None:
    assert len(ecn_bands((0, 8000, 8000, 65536), TOFINO)) == 1
    assert len(ecn_bands((0, 0, 8000, 0), TOFINO)) == 1


def test_device_data_is_what_bf_switchd_unpacks() -> None:
    blob = device_data(b"BIN", b"{ctx}", b"{bfrt}")
    chunks, at = [], 0
    while at < len(blob):
        (size,) = struct.unpack_from("<I", blob, at)
        chunks.append(blob[at + 4 : at + 4 + size])
        at += 4 + size
    assert chunks == [b"forgive", b"BIN", b"{ctx}", b"pipe", b"{bfrt}"]


# -- the description --------------------------------------------------------------------


def test_tofino_descriptions_are_checked() -> None:
    good = description("127.0.0.1:1", "127.0.0.1:2")
    parse(good)
    cases = [
        ({"deflect_ports": None}, "needs deflect_ports"),
        ({"deflect_ports": [3, 70]}, "two deflect ports in one pipe"),
        ({"deflect_ports": [200]}, "pipe 0, which has no deflect port"),
    ]
    for change, message in cases:
        bad = json.loads(json.dumps(good))
        bad["switches"]["s1"].update(change)
        if change["deflect_ports"] is None:
            del bad["switches"]["s1"]["deflect_ports"]
        with pytest.raises(ConfigError, match=message):
            parse(bad)
    mixed = json.loads(json.dumps(good))
    mixed["switches"]["s2"] = {"target": "bmv2", "grpc": "127.0.0.1:3", "thrift_port": 9090}
    with pytest.raises(ConfigError, match="mixes switch targets"):
        parse(mixed)


def test_tm_config_sets_priority_buffer_shaping_and_deflection() -> None:
    fabric = parse(description("127.0.0.1:1", "127.0.0.1:2"))
    config = tm_config(fabric, "s1", TOFINO)
    ops = config["operations"]
    assert config["cell_bytes"] == 80
    assert ops[0] == {
        "table": "tf1.tm.pipe.cfg",
        "pipe": 0,
        "data": {"mirror_drop_dev_port": 60, "mirror_drop_queue_nr": QID_HIGH},
    }

    def where(op: dict) -> tuple:
        place = op.get("queue") or op.get("key") or {}
        return (op["table"], place.get("dev_port"), place.get("qid"))

    by = {where(op): op for op in ops}
    assert len(by) == len(ops)
    for port in (1, 2, 3):
        assert by["tf1.tm.queue.sched_cfg", port, QID_HIGH]["data"] == {"max_priority": "HIGH"}
        assert by["tf1.tm.queue.sched_cfg", port, QID_LOW]["data"] == {"max_priority": "LOW"}
        buffer = by["tf1.tm.queue.buffer", port, QID_LOW]
        assert buffer["action"] == "buffer_only"
        assert buffer["data"]["guaranteed_cells"] == cells(40 * FRAME, TOFINO)
    assert by["tf1.tm.port.sched_shaping", 1, None]["data"]["max_rate"] == 10_000_000
    assert by["tf1.tm.port.sched_cfg", 1, None]["data"] == {"max_rate_enable": True}
    assert ("tf1.tm.port.sched_shaping", 2, None) not in by
    t2 = parse(description("127.0.0.1:1", "127.0.0.1:2", "tofino2"))
    two = tm_config(t2, "s1", CHIPS["tofino2"])
    assert {op["table"].split(".")[0] for op in two["operations"]} == {"tf2"}


# -- against a P4Runtime store ----------------------------------------------------------


@pytest.fixture
def switches(tmp_path):
    stores, servers, addresses = [], [], []
    for _ in range(2):
        store = Store()
        server, address = serve(store)
        stores.append(store)
        servers.append(server)
        addresses.append(address)
    info = tmp_path / "forgive.p4info.txtpb"
    info.write_text(text_format.MessageToString(p4info("tofino")))
    config = tmp_path / "device_config.bin"
    config.write_bytes(device_data(b"bin", b"{}", b"{}"))
    try:
        yield stores, addresses, info, config
    finally:
        for server in servers:
            server.stop(0)


def controller(switches, **extra) -> TofinoFabricController:
    _, (a1, a2), info, config = switches
    return TofinoFabricController(parse(description(a1, a2, **extra)), info, config)


def kinds(store: Store) -> dict[str, int]:
    names = {t.preamble.id: t.preamble.name for t in store.p4info.tables}
    count: dict[str, int] = {}
    for key, entity in store.entities.items():
        kind = names[entity.table_entry.table_id] if key[0] == "table_entry" else key[0]
        count[kind] = count.get(kind, 0) + 1
    return count


def test_apply_installs_the_tna_surface_and_is_idempotent(switches) -> None:
    (store1, store2), *_ = switches
    ctl = controller(switches)
    try:
        first = ctl.apply()
        bands = len(ecn_bands((0, THRESHOLDS["ecn_kmin"], THRESHOLDS["ecn_kmax"], 65536), TOFINO))
        # s1: ports 1-3 managed; h2 over a 2-member group; h1 direct
        assert kinds(store1) == {
            "packet_replication_engine_entry": 3,
            "ForgiveIngress.trim_sessions": 3,
            "ForgiveEgress.ecn_marking": 3 * bands,
            "action_profile_member": 2,
            "action_profile_group": 1,
            "ForgiveIngress.ecmp_nhop": 1,
            "ForgiveIngress.ipv4_lpm": 2,
        }
        assert first["s1"].pipeline_pushed and first["s1"].inserted == sum(kinds(store1).values())
        assert first["s2"].inserted == sum(kinds(store2).values())
        again = ctl.apply()
        assert all(
            (r.pipeline_pushed, r.inserted, r.modified, r.deleted) == (False, 0, 0, 0)
            for r in again.values()
        )
        sessions = [
            e.packet_replication_engine_entry.clone_session_entry
            for k, e in store1.entities.items()
            if k[0] == "packet_replication_engine_entry"
        ]
        assert sorted((s.session_id, s.replicas[0].egress_port) for s in sessions) == [
            (1, 1),
            (2, 2),
            (3, 3),
        ]
        assert {s.packet_length_bytes for s in sessions} == {TRIM_MIRROR_BYTES + TRIMMED_FRAME_LEN}
        ecn_id = next(t.preamble.id for t in store1.p4info.tables if t.preamble.name == ECN_TABLE)
        installed = set()
        for key in store1.entities:
            if key[0] == "table_entry" and key[1] == ecn_id and key[2][0][1] == 1:
                # a range of every value is an omitted field (don't care)
                ranges = {2: (0, (1 << 19) - 1), 3: (0, 0xFFFF)}
                ranges.update({f[0]: f[1:] for f in key[2][1:]})
                installed.add((ranges[2], ranges[3]))
        ramp = ecn_bands((0, THRESHOLDS["ecn_kmin"], THRESHOLDS["ecn_kmax"], 65536), TOFINO)
        assert installed == {((b.low, b.high), b.draws()) for b in ramp}
        assert ((cells(THRESHOLDS["ecn_kmax"], TOFINO), (1 << 19) - 1), (0, 0xFFFF)) in installed
    finally:
        ctl.close()


def test_changes_and_removals_are_written_in_an_order_a_switch_accepts(switches) -> None:
    (store1, _), (a1, a2), info, config = switches
    ctl = controller(switches)
    try:
        ctl.apply()
    finally:
        ctl.close()
    changed = controller(switches, ports={"s1:2": {"ecn_kmin": 2 * FRAME}})
    try:
        report = changed.apply()["s1"]
        assert report.modified + report.inserted + report.deleted > 0
    finally:
        changed.close()
    smaller = description(a1, a2, ports={"s1:2": {"ecn_kmin": 2 * FRAME}})
    del smaller["hosts"]["h2"]
    smaller["links"] = [link for link in smaller["links"] if link["b"] != "h2"]
    shrunk = TofinoFabricController(parse(smaller), info, config)
    try:
        shrunk.apply()
        assert "action_profile_group" not in kinds(store1)
        assert "action_profile_member" not in kinds(store1)
        assert kinds(store1)["ForgiveIngress.ipv4_lpm"] == 1
        last = store1.writes[-3:]
        # the route and the group's entry go before the group, the group before its members
        assert [{kind for _, kind in batch} for batch in last] == [
            {"table_entry"},
            {"action_profile_group"},
            {"action_profile_member"},
        ]
    finally:
        shrunk.close()


def test_counters_add_drops_from_both_pipes(switches) -> None:
    (store1, _), *_ = switches
    ctl = controller(switches)
    try:
        ctl.apply()
        ids = {c.preamble.name: c.preamble.id for c in store1.p4info.counters}
        store1.counters[ids["ForgiveIngress.port_drops"], 2] = (3, 0)
        store1.counters[ids["ForgiveEgress.port_drops"], 2] = (4, 0)
        store1.counters[ids["ForgiveEgress.port_trims"], 2] = (5, 0)
        store1.counters[ids["ForgiveEgress.port_trim_tx"], 2] = (4, 0)
        store1.counters[ids["ForgiveEgress.port_tx"], 2] = (9, 9000)
        rows = ctl.counters("s1")
        # trimmed 5, 4 of them sent: the TM dropped one (trimmed but dropped)
        assert rows[2] == PortCounters(
            tx_packets=9, tx_bytes=9000, trims=5, drops=7, trim_tx=4, trim_drops=1
        )
        assert sorted(rows) == [1, 2, 3]
    finally:
        ctl.close()


def test_cli_prints_tm_config_and_refuses_a_missing_build(tmp_path, capsys) -> None:
    path = tmp_path / "fabric.json"
    path.write_text(json.dumps(description("127.0.0.1:1", "127.0.0.1:2")))
    assert cli.main(["tm-config", str(path), "--switch", "s2"]) == 0
    (config,) = json.loads(capsys.readouterr().out)
    assert config["switch"] == "s2" and config["chip"] == "tofino"
    missing = tmp_path / "none.txtpb"
    assert cli.main(["apply", str(path), "--p4info", str(missing)]) == 2
    assert "cannot read P4Info" in capsys.readouterr().err


def test_tofino2_entries_use_its_narrower_mirror_session_ids(tmp_path) -> None:
    info = tmp_path / "t2.txtpb"
    info.write_text(text_format.MessageToString(p4info("tofino2")))
    config = tmp_path / "device_config.bin"
    config.write_bytes(b"")
    fabric = parse(description("127.0.0.1:1", "127.0.0.1:2", "tofino2"))
    ctl = TofinoFabricController(fabric, info, config)
    assert ctl.trim_sessions("s1") == {1: 1, 2: 2, 3: 3}
    (session_param,) = ctl.index.actions["ForgiveIngress.set_trim_session"].params
    assert session_param.bitwidth == 8
    ctl.close()


@pytest.mark.parametrize("target", sorted(CHIPS))
def test_stand_in_matches_the_compiled_p4info(target: str) -> None:
    path = committed(target)
    if not path.is_file():
        pytest.skip(f"{path.name} for {target} not committed yet (needs bf-p4c)")
    compiled, ours = surface(load_p4info(path)), surface(stand_in(target))
    for part in ours:
        for name, value in ours[part].items():
            assert compiled[part].get(name) == value, f"{part} {name}"


def test_entries_refuse_more_next_hops_than_the_selector_holds(switches) -> None:
    _, (a1, a2), info, config = switches
    desc = description(a1, a2)
    info_text = p4info("tofino")
    for profile in info_text.action_profiles:
        profile.max_group_size = 1
    small = info.with_name("small.txtpb")
    small.write_text(text_format.MessageToString(info_text))
    with pytest.raises(ConfigError, match="exceed the selector"):
        TofinoFabricController(parse(desc), small, config)


def test_more_entries_than_a_table_holds_are_refused(switches) -> None:
    _, (a1, a2), info, config = switches
    small = p4info("tofino")
    for table in small.tables:
        if table.preamble.name == ECN_TABLE:
            table.size = 2
    path = info.with_name("small-ecn.txtpb")
    path.write_text(text_format.MessageToString(small))
    with pytest.raises(ConfigError, match=r"ForgiveEgress\.ecn_marking, which holds 2"):
        TofinoFabricController(parse(description(a1, a2)), path, config)


# -- the trimming section on Tofino -----------------------------------------------------

TRIMMING = {
    "size": 128,
    "dscp_value": "from-tc",
    "tc_value": 5,
    "tc_to_dscp_map": {"host_trim": {"5": 3}, "fabric_trim": {"5": 7}},
    "port_qos_map": {"host": "host_trim", "fabric": "fabric_trim"},
    "trim_queue_bytes": 4096,
    "packet_discard_action": {"18": "drop", "20": "trim"},
    "disable_trim": [{"src_ip": "10.0.1.1/32"}, {"dst_ip": "10.0.2.0/24", "dscp": 26}],
}


def test_every_trimming_knob_becomes_tna_entries(switches) -> None:
    (store1, _), *_ = switches
    ctl = controller(switches, trimming=TRIMMING)
    try:
        ctl.apply()
        sessions = [
            e.packet_replication_engine_entry.clone_session_entry
            for k, e in store1.entities.items()
            if k[0] == "packet_replication_engine_entry"
        ]
        # size: the sessions cut at 128 bytes, the lengths are those of 128 bytes
        assert {s.packet_length_bytes for s in sessions} == {TRIM_MIRROR_BYTES + 128}
        (lengths,) = store1.held(TRIM_LENGTHS_TABLE)
        assert lengths.is_default_action
        assert store1.action_of(lengths) == (
            SET_TRIM_LENGTHS,
            {"ipv4_total_len": 128 - 14, "udp_len": 128 - 34},
        )
        # asymmetric DSCP: s1:1 faces h1, s1:2 and s1:3 face s2
        dscps = {
            int.from_bytes(e.match[0].exact.value, "big"): store1.action_of(e)[1]["dscp"]
            for e in store1.held(TRIM_DSCP.table)
        }
        assert dscps == {1: 3, 2: 7, 3: 7}
        # eligibility: class 18 drops, class 20 trims as every other class does
        (ineligible,) = store1.held("ForgiveIngress.trim_eligibility")
        assert int.from_bytes(ineligible.match[0].exact.value, "big") == 18
        assert store1.action_of(ineligible) == ("ForgiveIngress.disable_trim", {})
        # DISABLE_TRIM rules, the first one highest, a field left out not matched on
        rules = sorted(store1.held("ForgiveIngress.trim_acl"), key=lambda e: -e.priority)
        assert [(e.priority, len(e.match)) for e in rules] == [(2, 1), (1, 2)]
        first = rules[0].match[0].ternary
        assert (int.from_bytes(first.value, "big"), int.from_bytes(first.mask, "big")) == (
            0x0A000101,
            0xFFFFFFFF,
        )
        again = ctl.apply()
        assert all((r.inserted, r.modified, r.deleted) == (0, 0, 0) for r in again.values())
    finally:
        ctl.close()


def test_trim_queue_and_its_bound_are_tm_settings() -> None:
    """A bounded trim queue is a queue of its own at the high priority with the bound as
    its buffer; every trim session is pointed at it over BF-RT."""
    fabric = parse(description("127.0.0.1:1", "127.0.0.1:2", trimming=TRIMMING))
    assert trim_queue(fabric.trimming) == QID_TRIM
    ops = tm_config(fabric, "s1", TOFINO)["operations"]
    for port in (1, 2, 3):
        queue = {"dev_port": port, "qid": QID_TRIM}
        mine = [op for op in ops if op.get("queue") == queue]
        assert {op["table"]: op["data"] for op in mine} == {
            "tf1.tm.queue.sched_cfg": {"max_priority": "HIGH"},
            "tf1.tm.queue.buffer": {
                "guaranteed_cells": cells(4096, TOFINO),
                "tail_drop_enable": True,
            },
        }
    mirror = {op["key"]["$sid"]: op for op in ops if op["table"] == MIRROR_CFG}
    assert sorted(mirror) == [1, 2, 3]
    assert mirror[2]["action"] == "$normal" and mirror[2]["pipe"] == ALL_PIPES
    assert mirror[2]["data"]["$ucast_egress_port"] == 2
    assert mirror[2]["data"]["$egress_port_queue"] == QID_TRIM
    assert mirror[2]["data"]["$max_pkt_len"] == TRIM_MIRROR_BYTES + 128


def test_queue_index_zero_sends_trims_to_the_data_queue() -> None:
    fabric = parse(description("127.0.0.1:1", "127.0.0.1:2", trimming={"queue_index": 0}))
    assert trim_queue(fabric.trimming) == QID_LOW
    ops = tm_config(fabric, "s1", TOFINO)["operations"]
    mirror = [op for op in ops if op["table"] == MIRROR_CFG]
    assert {op["data"]["$egress_port_queue"] for op in mirror} == {QID_LOW}
    assert {op["data"]["$max_pkt_len"] for op in mirror} == {TRIM_MIRROR_BYTES + TRIMMED_FRAME_LEN}
    assert not [op for op in ops if op.get("queue", {}).get("qid") == QID_TRIM]
    default = tm_config(parse(description("127.0.0.1:1", "127.0.0.1:2")), "s1", TOFINO)
    assert not [op for op in default["operations"] if op["table"] == MIRROR_CFG]
    assert trim_queue(parse(description("127.0.0.1:1", "127.0.0.1:2")).trimming) == QID_HIGH


def test_one_trim_dscp_is_the_default_entry_and_going_back_restores_noaction(switches) -> None:
    (store1, _), *_ = switches
    static = controller(switches, trimming={"dscp_value": 48, "size": 64})
    try:
        static.apply()
        (dscp,) = store1.held(TRIM_DSCP.table)
        assert dscp.is_default_action and store1.action_of(dscp) == (
            TRIM_DSCP.action,
            {"dscp": 48},
        )
    finally:
        static.close()
    per_port = controller(switches, trimming=TRIMMING)
    try:
        per_port.apply()
    finally:
        per_port.close()
    plain = controller(switches)
    try:
        report = plain.apply()["s1"]
        # the three per-port DSCPs, two rules and one class go; the three sessions
        # cut at 58 bytes again and trim_lengths returns to NoAction
        assert (report.deleted, report.modified) == (6, 3 + 1)
        for table in (TRIM_DSCP.table, TRIM_LENGTHS_TABLE):
            (entry,) = store1.held(table)
            assert entry.is_default_action and store1.action_of(entry)[0] == "NoAction"
        assert not store1.held("ForgiveIngress.trim_acl")
        assert plain.apply()["s1"].modified == 0
    finally:
        plain.close()


@given(st.integers(0, 1000), st.integers(0, 1000))
def test_trimmed_but_dropped_is_what_was_trimmed_and_not_sent(trims: int, sent: int) -> None:
    counters = with_trim_drops(PortCounters(trims=trims, trim_tx=min(trims, sent)))
    assert counters.trim_drops == trims - min(trims, sent)
    assert counters.trim_tx + counters.trim_drops == counters.trims
    # a read that saw a header sent before its trim was counted never goes negative
    assert with_trim_drops(PortCounters(trims=trims, trim_tx=trims + 1)).trim_drops == 0
