"""The FORGIVE control surface as the PTF suite, the tests and the benchmarks drive it.

A thin session over the project's one P4Runtime client (`controller.client`)
and its entry builders (`controller.entries`), taking the addresses PTF tests
write as text. Any target that serves forgive.p4's P4Info (BMv2, the switch
model) is driven by the same calls.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path

from p4.v1 import p4runtime_pb2

from controller import entries
from controller.client import SwitchClient
from controller.p4info import P4InfoIndex, load_p4info
from switch_model.surface import PortCounters, SwitchTrimming, Thresholds

DEVICE_ID = 0
"""The device id the harness starts every target with."""


def _prefix(text: str) -> tuple[int, int]:
    net = ipaddress.IPv4Network(text)
    return int(net.network_address), net.prefixlen


def _mac(text: str) -> int:
    return int(text.replace(":", ""), 16)


class SwitchSession:
    """One primary connection; pushing the pipeline at the start resets all switch state."""

    def __init__(self, grpc_addr: str, p4info: str | Path, device_config: str | Path) -> None:
        self.index = P4InfoIndex(load_p4info(p4info))
        self.client = SwitchClient(grpc_addr, grpc_addr, DEVICE_ID)
        self.client.connect()
        try:
            self.client.set_pipeline(self.index.p4info, Path(device_config).read_bytes(), 1)
        except BaseException:
            self.client.close()
            raise

    def close(self) -> None:
        self.client.close()

    def route(self, prefix: str, dmac: str, port: int) -> None:
        self.client.insert([entries.route(self.index, *_prefix(prefix), _mac(dmac), port)])

    def route_ecmp(self, prefix: str, group_id: int, members: Sequence[tuple[str, int]]) -> None:
        """Route `prefix` to an ECMP group whose member i is next hop members[i] (dmac, port)."""
        self.client.insert(
            [
                *(
                    entries.ecmp_member(self.index, group_id, member, _mac(dmac), port)
                    for member, (dmac, port) in enumerate(members)
                ),
                entries.ecmp_route(self.index, *_prefix(prefix), group_id, len(members)),
            ]
        )

    def set_thresholds(self, port: int, thresholds: Thresholds) -> None:
        self.client.insert([entries.port_thresholds(self.index, port, thresholds)])

    def _modify(self, entry) -> None:
        update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
        update.entity.table_entry.CopyFrom(entry)
        self.client.write([update])

    def set_switch_trimming(self, trimming: SwitchTrimming) -> None:
        """The switch-wide trim size and queue (switch_trimming's default entry)."""
        self._modify(entries.switch_trimming(self.index, trimming))

    def set_trim_dscp(self, dscp: int, port: int | None = None) -> None:
        """Trimmed packets get `dscp`: on every port (the default entry), or on `port`."""
        if port is None:
            self._modify(entries.trim_dscp_default(self.index, dscp))
        else:
            self.client.insert([entries.trim_dscp(self.index, port, dscp)])

    def set_trim_queue_bytes(self, port: int, trim_queue_bytes: int) -> None:
        self.client.insert([entries.trim_queue_limit(self.index, port, trim_queue_bytes)])

    def disable_trim_class(self, dscp: int) -> None:
        """Traffic class `dscp` drops instead of trimming (packet_discard_action drop)."""
        self.client.insert([entries.trim_ineligible(self.index, dscp)])

    def disable_trim_rule(self, priority: int, src: str | None = None, dscp: int | None = None):
        """An ACL DISABLE_TRIM rule on a source prefix and/or a DSCP."""
        self.client.insert(
            [
                entries.trim_acl(
                    self.index, priority, None if src is None else _prefix(src), dscp=dscp
                )
            ]
        )

    def port_counters(self, port: int) -> PortCounters:
        return entries.read_port_counters(self.client, self.index, [port])[port]
