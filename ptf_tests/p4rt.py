"""The FORGIVE control surface as the PTF suite drives it, over P4Runtime.

Names here are the ones docs/dataplane.md fixes; any target that serves the
same P4Info (BMv2, the switch model) is driven by the same calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import p4runtime_sh.shell as sh
from p4runtime_sh.p4runtime import P4RuntimeException


@dataclass(frozen=True)
class Thresholds:
    data_queue_bytes: int
    ecn_kmin: int
    ecn_kmax: int
    ecn_pmax: int
    """Marking probability at ecn_kmax in units of 1/65536 (65536 = certain)."""


@dataclass(frozen=True)
class PortCounters:
    tx_packets: int
    tx_bytes: int
    ce_marks: int
    trims: int
    drops: int


class SwitchSession:
    """One P4Runtime primary connection; pushing the pipeline resets all switch state."""

    def __init__(self, grpc_addr: str, p4info: str, device_config: str) -> None:
        try:
            sh.setup(
                device_id=0,
                grpc_addr=grpc_addr,
                election_id=(0, 1),
                config=sh.FwdPipeConfig(p4info, device_config),
                verbose=False,
            )
        except SystemExit as exc:  # p4runtime-shell exits on a failed pipeline push
            raise RuntimeError(f"pipeline push to {grpc_addr} failed") from exc

    def close(self) -> None:
        sh.teardown()

    def route(self, prefix: str, dmac: str, port: int) -> None:
        entry = sh.TableEntry("MyIngress.ipv4_lpm")(action="MyIngress.set_nhop")
        entry.match["hdr.ipv4.dstAddr"] = prefix
        entry.action["dmac"] = dmac
        entry.action["port"] = str(port)
        entry.insert()

    def route_ecmp(self, prefix: str, group_id: int, members: Sequence[tuple[str, int]]) -> None:
        """Route `prefix` to an ECMP group whose member i is next hop members[i] (dmac, port)."""
        entry = sh.TableEntry("MyIngress.ipv4_lpm")(action="MyIngress.set_ecmp_group")
        entry.match["hdr.ipv4.dstAddr"] = prefix
        entry.action["group_id"] = str(group_id)
        entry.action["num_members"] = str(len(members))
        entry.insert()
        for member, (dmac, port) in enumerate(members):
            nhop = sh.TableEntry("MyIngress.ecmp_nhop")(action="MyIngress.set_nhop")
            nhop.match["meta.ecmp_group_id"] = str(group_id)
            nhop.match["meta.ecmp_member"] = str(member)
            nhop.action["dmac"] = dmac
            nhop.action["port"] = str(port)
            nhop.insert()

    def set_thresholds(self, port: int, t: Thresholds) -> None:
        entry = sh.TableEntry("MyIngress.port_thresholds")(action="MyIngress.set_thresholds")
        entry.match["standard_metadata.egress_spec"] = str(port)
        entry.action["data_queue_bytes"] = str(t.data_queue_bytes)
        entry.action["ecn_kmin"] = str(t.ecn_kmin)
        entry.action["ecn_kmax"] = str(t.ecn_kmax)
        entry.action["ecn_pmax"] = str(t.ecn_pmax)
        entry.insert()

    def port_counters(self, port: int) -> PortCounters:
        tx_packets, tx_bytes = self._read_counter("MyEgress.port_tx", port)
        return PortCounters(
            tx_packets=tx_packets,
            tx_bytes=tx_bytes,
            ce_marks=self._read_counter("MyIngress.port_ce_marks", port)[0],
            trims=self._read_counter("MyIngress.port_trims", port)[0],
            drops=self._read_counter("MyIngress.port_drops", port)[0],
        )

    @staticmethod
    def _read_counter(name: str, index: int) -> tuple[int, int]:
        counter = sh.CounterEntry(name)
        counter.index = index
        try:
            (entry,) = list(counter.read())
        except P4RuntimeException as exc:
            raise RuntimeError(f"reading {name}[{index}] failed: {exc}") from exc
        return entry.packet_count, entry.byte_count
