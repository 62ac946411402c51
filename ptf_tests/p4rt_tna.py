"""The PTF suite's control calls for p4src/tna/forgive.p4 (docs/tofino.md).

Same calls as SwitchSession; what they install differs: an ECMP group is a
group of the selector's members, thresholds become a trim clone session, the
ECN bands in cells, and the data queue's TM buffer (over the target's BF-RT
channel), and drops are the sum of the ingress and egress counters. The
entries are the ones controller.tofino computes for a fabric.
"""

from __future__ import annotations

from collections.abc import Sequence

import p4runtime_sh.shell as sh

from controller.fabric_control import ECMP_TABLE, LPM_TABLE
from controller.p4info import load_p4info
from controller.tofino import (
    ECMP_PROFILE,
    ECN_TABLE,
    PACKET_COUNTERS,
    QUEUE_DEPTH_BITS,
    TRIM_MIRROR_BYTES,
    TRIM_TABLE,
    TX_COUNTER,
    ecn_bands,
)
from host_agent.wire import TRIMMED_FRAME_LEN
from ptf_tests.p4rt import PortCounters, SwitchSession, Thresholds


class TnaSwitchSession(SwitchSession):
    def __init__(self, grpc_addr: str, p4info: str, device_config: str, target) -> None:
        super().__init__(grpc_addr, p4info, device_config)
        self.target = target
        profiles = {p.preamble.name: p for p in load_p4info(p4info).action_profiles}
        self.max_group_size = profiles[ECMP_PROFILE].max_group_size
        self.members = 0
        self.sessions: dict[int, int] = {}

    def route_ecmp(self, prefix: str, group_id: int, members: Sequence[tuple[str, int]]) -> None:
        group = sh.ActionProfileGroup(ECMP_PROFILE)(group_id=group_id)
        group.max_size = self.max_group_size
        for dmac, port in members:
            self.members += 1
            member = sh.ActionProfileMember(ECMP_PROFILE)(
                member_id=self.members, action="MyIngress.set_nhop"
            )
            member.action["dmac"] = dmac
            member.action["port"] = str(port)
            member.insert()
            group.add(self.members)
        group.insert()
        nhop = sh.TableEntry(ECMP_TABLE)
        nhop.match["meta.ecmp_group_id"] = str(group_id)
        nhop.group_id = group_id
        nhop.insert()
        route = sh.TableEntry(LPM_TABLE)(action="MyIngress.set_ecmp_group")
        route.match["hdr.ipv4.dstAddr"] = prefix
        route.action["group_id"] = str(group_id)
        route.insert()

    def set_thresholds(self, port: int, t: Thresholds) -> None:
        session = self.sessions.setdefault(port, len(self.sessions) + 1)
        clone = sh.CloneSessionEntry(session)
        clone.add(port, 0)
        clone.packet_length_bytes = TRIM_MIRROR_BYTES + TRIMMED_FRAME_LEN
        clone.insert()
        trim = sh.TableEntry(TRIM_TABLE)(action="MyIngress.set_trim_session")
        trim.match["egress_port"] = str(port)
        trim.action["session"] = str(session)
        trim.insert()
        thresholds = (t.data_queue_bytes, t.ecn_kmin, t.ecn_kmax, t.ecn_pmax)
        for band in ecn_bands(thresholds, self.target.chip):
            entry = sh.TableEntry(ECN_TABLE)(action="MyEgress.mark_ce")
            entry.match["egress_port"] = str(port)
            # a range of every value is P4Runtime's "don't care": left out
            for field, (low, high), top in (
                ("enq_qdepth", (band.low, band.high), (1 << QUEUE_DEPTH_BITS) - 1),
                ("mark_draw", band.draws(), 0xFFFF),
            ):
                if (low, high) != (0, top):
                    entry.match[field] = f"{low}..{high}"
            entry.priority = 1
            entry.insert()
        self.target.set_data_queue(port, t.data_queue_bytes)

    def port_counters(self, port: int) -> PortCounters:
        tx_packets, tx_bytes = self._read_counter(TX_COUNTER, port)
        counts = dict.fromkeys(set(PACKET_COUNTERS.values()), 0)
        for name, column in PACKET_COUNTERS.items():
            counts[column] += self._read_counter(name, port)[0]
        return PortCounters(tx_packets=tx_packets, tx_bytes=tx_bytes, **counts)
