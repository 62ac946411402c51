"""The PTF suite's control calls for p4src/tna/forgive.p4 (docs/tofino.md).

Same calls as SwitchSession; what they install differs: an ECMP group is a
group of the selector's members, thresholds become a trim clone session, the
ECN bands in cells and the data queue's TM buffer (over the target's BF-RT
channel), and drops are the sum of the ingress and egress counters. The
entities are controller.tofino's, the ones the controller installs.
"""

from __future__ import annotations

from collections.abc import Sequence

from p4.v1 import p4runtime_pb2

from controller import entries, tofino
from ptf_tests.p4rt import SwitchSession, _mac, _prefix
from switch_model.surface import PortCounters, Thresholds


class TnaSwitchSession(SwitchSession):
    def __init__(self, grpc_addr: str, p4info, device_config, target) -> None:
        super().__init__(grpc_addr, p4info, device_config)
        self.target = target
        self.members = 0
        self.sessions: dict[int, int] = {}

    def _insert(self, entities: Sequence[p4runtime_pb2.Entity]) -> None:
        update = p4runtime_pb2.Update.INSERT
        self.client.write([p4runtime_pb2.Update(type=update, entity=e) for e in entities])

    def route_ecmp(self, prefix: str, group_id: int, members: Sequence[tuple[str, int]]) -> None:
        """Route `prefix` to an ECMP group of these next hops (dmac, port)."""
        ids = []
        for dmac, port in members:
            self.members += 1
            ids.append(self.members)
            self._insert([tofino.ecmp_member(self.index, self.members, _mac(dmac), port)])
        for entity in tofino.ecmp_group(self.index, group_id, ids):
            self._insert([entity])
        self.client.insert([tofino.ecmp_route(self.index, *_prefix(prefix), group_id)])

    def set_thresholds(self, port: int, thresholds: Thresholds) -> None:
        session = self.sessions.setdefault(port, len(self.sessions) + 1)
        self._insert([tofino.clone_session(port, session)])
        self.client.insert(
            [
                tofino.trim_session(self.index, port, session),
                *tofino.ecn_entries(self.index, port, thresholds, self.target.chip),
            ]
        )
        self.target.set_data_queue(port, thresholds.data_queue_bytes)

    def port_counters(self, port: int) -> PortCounters:
        return entries.read_port_counters(self.client, self.index, [port], tofino.COUNTER_FIELDS)[
            port
        ]
