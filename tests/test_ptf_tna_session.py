"""The PTF suite's TNA control calls (ptf_tests/p4rt_tna.py), through
p4runtime-shell, against a P4Runtime server that holds entities the way a
switch must: what tofino-model would be given, checked where it cannot run."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from p4rt_store import Store, serve
from tna_p4info import p4info

from controller.tofino import TRIM_MIRROR_BYTES, ecn_bands
from controller.tofino_pipeline import CHIPS, device_data
from host_agent.wire import TRIMMED_FRAME_LEN
from ptf_tests.p4rt_tna import TnaSwitchSession
from switch_model.surface import Thresholds

FRAME = 4154


class RecordingTarget:
    """What the session asks of the target beyond P4Runtime: the data queue's buffer."""

    chip = CHIPS["tofino"]

    def __init__(self) -> None:
        self.data_queues: dict[int, int] = {}

    def set_data_queue(self, port: int, nbytes: int) -> None:
        self.data_queues[port] = nbytes


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
