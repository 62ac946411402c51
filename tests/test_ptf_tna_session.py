"""The PTF suite's TNA control calls (controller/tna_session.py), through
p4runtime-shell, against a P4Runtime server that holds entities the way a
switch must: what tofino-model would be given, checked where it cannot run."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from p4rt_store import Store, serve
from tna_p4info import p4info

from common.p4names import SET_TRIM_LENGTHS, TRIM_LENGTHS_TABLE
from common.wire import TRIMMED_FRAME_LEN, Dscp
from controller.tna_session import TnaSwitchSession
from controller.tofino import (
    MIRROR_CFG,
    QID_LOW,
    QID_TRIM,
    TRIM_DSCP,
    TRIM_MIRROR_BYTES,
    cells,
    ecn_bands,
)
from controller.tofino_pipeline import CHIPS, device_data
from switch_model.port import PRIO_HIGH, PRIO_LOW
from switch_model.surface import SwitchTrimming, Thresholds

FRAME = 4154


class RecordingTarget:
    """What the session asks of the target beyond P4Runtime: the data queue's buffer,
    and BF-RT operations (the trim queue)."""

    chip = CHIPS["tofino"]

    def __init__(self) -> None:
        self.data_queues: dict[int, int] = {}
        self.tm_ops: list[dict] = []

    def set_data_queue(self, port: int, nbytes: int) -> None:
        self.data_queues[port] = nbytes

    def apply_tm(self, ops: list[dict]) -> None:
        self.tm_ops += ops


@pytest.fixture
def session(tmp_path):
    store = Store()
    server, address = serve(store)
    info = tmp_path / "forgive.p4info.txtpb"
    info.write_text(text_format.MessageToString(p4info("tofino")))
    config = tmp_path / "device_config.bin"
    config.write_bytes(device_data(b"bin", b"{}", b"{}"))
    target = RecordingTarget()
    switch = TnaSwitchSession(address, str(info), str(config), target)
    try:
        yield switch, store, target
    finally:
        switch.close()
        server.stop(0)


def of_kind(store: Store, kind: str) -> list:
    return [e for k, e in store.entities.items() if k[0] == kind]


def test_routes_groups_and_thresholds_are_what_a_switch_accepts(session) -> None:
    switch, store, target = session
    switch.route("10.0.2.0/24", "02:00:00:00:02:02", 2)
    switch.route_ecmp("10.0.9.0/24", 7, [("02:00:00:00:02:02", 2), ("02:00:00:00:03:03", 3)])
    (group,) = of_kind(store, "action_profile_group")
    assert group.action_profile_group.group_id == 7
    assert len(group.action_profile_group.members) == 2
    assert len(of_kind(store, "action_profile_member")) == 2

    thresholds = Thresholds(100 * FRAME, 2 * FRAME, 6 * FRAME, 65536)
    switch.set_thresholds(2, thresholds)
    (clone,) = of_kind(store, "packet_replication_engine_entry")
    session_entry = clone.packet_replication_engine_entry.clone_session_entry
    assert [r.egress_port for r in session_entry.replicas] == [2]
    assert session_entry.packet_length_bytes == TRIM_MIRROR_BYTES + TRIMMED_FRAME_LEN
    bands = ecn_bands((100 * FRAME, 2 * FRAME, 6 * FRAME, 65536), target.chip)
    tables = {t.preamble.id: t.preamble.name for t in store.p4info.tables}
    names = [tables[e.table_entry.table_id] for e in of_kind(store, "table_entry")]
    assert names.count("ForgiveEgress.ecn_marking") == len(bands)
    assert names.count("ForgiveIngress.trim_sessions") == 1
    assert (
        names.count("ForgiveIngress.ecmp_nhop") == 1 and names.count("ForgiveIngress.ipv4_lpm") == 2
    )
    assert target.data_queues == {2: 100 * FRAME}


def test_drops_add_the_ingress_and_egress_counters(session) -> None:
    switch, store, _ = session
    ids = {c.preamble.name: c.preamble.id for c in store.p4info.counters}
    store.counters[ids["ForgiveIngress.port_drops"], 3] = (2, 0)
    store.counters[ids["ForgiveEgress.port_drops"], 3] = (5, 0)
    store.counters[ids["ForgiveEgress.port_tx"], 3] = (4, 4 * 62)
    counters = switch.port_counters(3)
    assert (counters.drops, counters.tx_packets, counters.tx_bytes) == (7, 4, 248)


# -- the trimming knobs, one call each ---------------------------------------------------

THRESHOLDS = Thresholds(100 * FRAME, 50 * FRAME, 50 * FRAME, 0)


def session_lengths(store: Store) -> dict[int, int]:
    sessions = [
        e.packet_replication_engine_entry.clone_session_entry
        for e in of_kind(store, "packet_replication_engine_entry")
    ]
    return {s.replicas[0].egress_port: s.packet_length_bytes for s in sessions}


def test_trim_size_cuts_in_every_session_and_sets_the_lengths(session) -> None:
    switch, store, target = session
    switch.set_thresholds(2, THRESHOLDS)
    switch.set_switch_trimming(SwitchTrimming(128, PRIO_HIGH))
    switch.set_thresholds(3, THRESHOLDS)
    assert session_lengths(store) == {2: TRIM_MIRROR_BYTES + 128, 3: TRIM_MIRROR_BYTES + 128}
    (lengths,) = store.held(TRIM_LENGTHS_TABLE)
    assert store.action_of(lengths) == (SET_TRIM_LENGTHS, {"ipv4_total_len": 114, "udp_len": 94})
    assert target.tm_ops == [], "the trims stay in the high queue, as mirrored copies do"


def test_trim_dscp_one_for_all_ports_or_per_port(session) -> None:
    switch, store, _ = session
    switch.set_trim_dscp(Dscp.CONTROL)
    switch.set_trim_dscp(3, port=2)
    switch.set_trim_dscp(7, port=3)
    by_port = {}
    for entry in store.held(TRIM_DSCP.table):
        port = int.from_bytes(entry.match[0].exact.value, "big") if entry.match else None
        by_port[port] = store.action_of(entry)
    assert by_port == {
        None: (TRIM_DSCP.action, {"dscp": Dscp.CONTROL}),
        2: (TRIM_DSCP.action, {"dscp": 3}),
        3: (TRIM_DSCP.action, {"dscp": 7}),
    }


def test_eligibility_and_disable_trim_rules_use_the_v1model_calls(session) -> None:
    switch, store, _ = session
    switch.disable_trim_class(Dscp.TENSOR_PARALLEL)
    switch.disable_trim_rule(2, src="10.0.1.7/32")
    switch.disable_trim_rule(1, dscp=Dscp.PIPELINE_PARALLEL)
    (cls,) = store.held("ForgiveIngress.trim_eligibility")
    assert int.from_bytes(cls.match[0].exact.value, "big") == Dscp.TENSOR_PARALLEL
    rules = {e.priority: e for e in store.held("ForgiveIngress.trim_acl")}
    assert sorted(rules) == [1, 2]
    assert [store.action_of(e)[0] for e in (cls, *rules.values())] == [
        "ForgiveIngress.disable_trim"
    ] * 3


def test_queue_index_zero_points_the_sessions_at_the_data_queue(session) -> None:
    switch, _, target = session
    switch.set_thresholds(2, THRESHOLDS)
    switch.set_switch_trimming(SwitchTrimming(58, PRIO_LOW))
    (op,) = target.tm_ops
    assert op["table"] == MIRROR_CFG and op["key"] == {"$sid": 1}
    assert (op["data"]["$ucast_egress_port"], op["data"]["$egress_port_queue"]) == (2, QID_LOW)


def test_a_bounded_trim_queue_is_a_tm_queue_of_its_own(session) -> None:
    switch, _, target = session
    switch.set_thresholds(2, THRESHOLDS)
    switch.set_trim_queue_bytes(2, 2 * 58)
    by_table = {op["table"]: op for op in target.tm_ops}
    assert by_table["tf1.tm.queue.sched_cfg"]["queue"] == {"dev_port": 2, "qid": QID_TRIM}
    assert by_table["tf1.tm.queue.sched_cfg"]["data"] == {"max_priority": "HIGH"}
    assert by_table["tf1.tm.queue.buffer"]["data"]["guaranteed_cells"] == cells(116, target.chip)
    assert by_table[MIRROR_CFG]["data"]["$egress_port_queue"] == QID_TRIM


def test_trimmed_but_dropped_is_trimmed_less_sent(session) -> None:
    switch, store, _ = session
    ids = {c.preamble.name: c.preamble.id for c in store.p4info.counters}
    store.counters[ids["ForgiveEgress.port_trims"], 2] = (5, 0)
    store.counters[ids["ForgiveEgress.port_trim_tx"], 2] = (2, 0)
    counters = switch.port_counters(2)
    assert (counters.trims, counters.trim_tx, counters.trim_drops) == (5, 2, 3)
