"""The PTF suite's control calls for p4src/tna/forgive.p4 (docs/tofino.md).

Same calls as SwitchSession; what they install differs: an ECMP group is a
group of the selector's members, thresholds become a trim clone session, the
ECN bands in cells and the data queue's TM buffer (over the target's BF-RT
channel), and drops are the sum of the ingress and egress counters. The
trimming calls set the trim size in the sessions and trim_lengths, the trim
DSCP in egress, and the trim queue over BF-RT; eligibility and DISABLE_TRIM
rules are the v1model calls, whose tables the TNA program names alike.
Trimmed but dropped is the difference of two counters (controller.tofino).
The entities are controller.tofino's, the ones the controller installs.
"""

from __future__ import annotations

from collections.abc import Sequence

from p4.v1 import p4runtime_pb2

from controller import entries, tofino
from controller.session import SwitchSession, _mac, _prefix
from controller.trimming import Trimming
from switch_model.surface import DEFAULT_TRIMMING, PortCounters, SwitchTrimming, Thresholds


class TnaSwitchSession(SwitchSession):
    def __init__(self, grpc_addr: str, p4info, device_config, target) -> None:
        super().__init__(grpc_addr, p4info, device_config)
        self.target = target
        self.members = 0
        self.sessions: dict[int, int] = {}
        self.trimming = DEFAULT_TRIMMING
        self.trim_queue_bytes: int | None = None

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
        self._insert([tofino.clone_session(port, session, self.trimming.size)])
        self.client.insert(
            [
                tofino.trim_session(self.index, port, session),
                *tofino.ecn_entries(self.index, port, thresholds, self.target.chip),
            ]
        )
        self.target.set_data_queue(port, thresholds.data_queue_bytes)
        self._send_trims(port)

    def _send_trims(self, port: int) -> None:
        ops = tofino.trim_queue_ops(
            self.target.chip,
            port,
            self.sessions[port],
            self.trimming.size,
            tofino.trim_queue(
                Trimming(**self.trimming._asdict(), trim_queue_bytes=self.trim_queue_bytes)
            ),
            self.trim_queue_bytes,
        )
        if ops:
            self.target.apply_tm(ops)

    def set_switch_trimming(self, trimming: SwitchTrimming) -> None:
        """The trim size (the sessions' cut and trim_lengths) and the trim queue; managed
        ports set up before and after take both."""
        self.trimming = trimming
        self._modify(tofino.trim_lengths(self.index, trimming.size))
        update = p4runtime_pb2.Update.MODIFY
        self.client.write(
            [
                p4runtime_pb2.Update(type=update, entity=tofino.clone_session(p, s, trimming.size))
                for p, s in self.sessions.items()
            ]
        )
        for port in self.sessions:
            self._send_trims(port)

    def set_trim_dscp(self, dscp: int, port: int | None = None) -> None:
        """As SwitchSession's, in the egress table of the TNA program."""
        if port is None:
            self._modify(entries.trim_dscp_default(self.index, dscp, tofino.TRIM_DSCP))
        else:
            self.client.insert([entries.trim_dscp(self.index, port, dscp, tofino.TRIM_DSCP)])

    def set_trim_queue_bytes(self, port: int, trim_queue_bytes: int) -> None:
        """Trims of managed `port` go to a queue of their own holding `trim_queue_bytes`."""
        self.trim_queue_bytes = trim_queue_bytes
        self._send_trims(port)

    def port_counters(self, port: int) -> PortCounters:
        rows = entries.read_port_counters(self.client, self.index, [port], tofino.COUNTER_FIELDS)
        return tofino.with_trim_drops(rows[port])
