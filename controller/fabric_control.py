"""Bring a fabric's switches to the state its description asks for, idempotently.

`FabricController.apply` validates everything it can (description, P4Info,
device config, reachability of every switch) before its first write. Then per
switch it pushes the pipeline unless the same one is already there, computes
the wanted table entries, reads what is installed and writes only the
difference: new entries inserted, changed ones modified, stale ones deleted.
Re-running it on a configured fabric writes nothing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import grpc
from p4.v1 import p4runtime_pb2

from common import p4names
from common.tls import ClientTls
from controller import entries
from controller.client import SwitchClient
from controller.p4info import ConfigError, P4InfoIndex, entry_action, entry_key, load_p4info
from controller.shaping import apply_shaping, check_shaping_channel
from controller.topology import Fabric
from controller.trimming import DSCP_FROM_TC, Trimming
from switch_model.surface import DEFAULT_TRIMMING, PortCounters

TABLES = (
    p4names.THRESHOLD_TABLE,
    p4names.TRIM_ELIGIBILITY_TABLE,
    p4names.TRIM_ACL_TABLE,
    p4names.TRIM_DSCP_TABLE,
    p4names.TRIM_QUEUE_TABLE,
    p4names.ECMP_TABLE,
    p4names.LPM_TABLE,
)
"""In the order entries are inserted: an ECMP route after its group's members."""
DEFAULT_TABLES = (p4names.SWITCH_TRIMMING_TABLE, p4names.TRIM_DSCP_TABLE)
"""Tables whose default entry the description sets (switch-wide trimming)."""

_Update = p4runtime_pb2.Update


@dataclass
class ApplyReport:
    """What one apply changed on one switch."""

    pipeline_pushed: bool
    inserted: int
    modified: int
    deleted: int


class FabricController:
    def __init__(
        self,
        fabric: Fabric,
        p4info_path: str | Path,
        device_config_path: str | Path,
        tls: ClientTls | None = None,
    ):
        """`tls`: P4Runtime over TLS to every switch (common.tls), None for none."""
        self.fabric = fabric
        self.p4info = load_p4info(p4info_path)
        try:
            self.device_config = Path(device_config_path).read_bytes()
        except OSError as err:
            raise ConfigError(
                f"cannot read device config {device_config_path}: {err.strerror}"
            ) from None
        self.index = P4InfoIndex(self.p4info)
        self.cookie = int.from_bytes(
            hashlib.sha256(self.p4info.SerializeToString() + self.device_config).digest()[:8],
            "big",
        )
        self.clients = {
            name: SwitchClient(name, spec.grpc, spec.device_id, tls=tls)
            for name, spec in fabric.switches.items()
        }
        self.wanted = {name: self.entries(name) for name in fabric.switches}
        for name in sorted(fabric.switches):
            self.index.check_capacity(name, self.table_entries(name))

    def table_entries(self, switch: str) -> list[p4runtime_pb2.TableEntry]:
        """The table entries `switch` should hold (what the tables' sizes bound)."""
        return self.wanted[switch]

    def connect(self, write: bool = True) -> None:
        """Reach every switch first, and for writing become its primary and reach its shaping
        channel, so that an unreachable or held switch stops the run before any write.
        Reading counters needs neither."""
        for name, client in self.clients.items():
            client.connect(primary=write)
            if write:
                check_shaping_channel(self.fabric.switches[name])

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def entries(self, switch: str) -> list[p4runtime_pb2.TableEntry]:
        """Every entry `switch` should hold, its default entries (the last) included."""
        return switch_entries(self.fabric, self.index, switch) + switch_defaults(
            self.fabric, self.index, switch
        )

    def _sync_pipeline(self, client: SwitchClient) -> bool:
        try:
            current = client.get_pipeline()
        except grpc.RpcError as err:
            # a switch without a pipeline says FAILED_PRECONDITION (BMv2 and the model)
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
        else:
            if current.HasField("cookie") and current.cookie.cookie == self.cookie:
                return False
        client.set_pipeline(self.p4info, self.device_config, self.cookie)
        return True

    def apply_switch(self, switch: str) -> ApplyReport:
        client = self.clients[switch]
        pushed = self._sync_pipeline(client)
        tables = [self.index.table_id(t) for t in TABLES]
        query = []
        for table_id in tables:
            entity = p4runtime_pb2.Entity()
            entity.table_entry.table_id = table_id
            query.append(entity)
        installed = {entry_key(e.table_entry): e.table_entry for e in client.read(query)}
        wanted = {entry_key(e): e for e in self.wanted[switch] if not e.is_default_action}
        updates = []
        counts = {"inserted": 0, "modified": 0, "deleted": 0}
        for key, entry in wanted.items():
            have = installed.get(key)
            if have is None:
                kind, counts["inserted"] = _Update.INSERT, counts["inserted"] + 1
            elif entry_action(have) != entry_action(entry):
                kind, counts["modified"] = _Update.MODIFY, counts["modified"] + 1
            else:
                continue
            update = _Update(type=kind)
            update.entity.table_entry.CopyFrom(entry)
            updates.append(update)
        stale = sorted(
            (key for key in installed if key not in wanted),
            key=lambda k: tables.index(k[0]),
            reverse=True,
        )
        for key in stale:
            update = _Update(type=_Update.DELETE)
            update.entity.table_entry.CopyFrom(installed[key])
            update.entity.table_entry.ClearField("action")
            updates.append(update)
            counts["deleted"] += 1
        defaults = self._default_updates(client, switch)
        counts["modified"] += len(defaults)
        client.write(updates + defaults)
        apply_shaping(
            self.fabric.switches[switch],
            {port: spec for (name, port), spec in self.fabric.ports.items() if name == switch},
        )
        return ApplyReport(pushed, **counts)

    def _default_updates(self, client: SwitchClient, switch: str) -> list[_Update]:
        """MODIFY of each default entry the description sets that the switch holds otherwise."""
        defaults = [e for e in self.wanted[switch] if e.is_default_action]
        query = []
        for entry in defaults:
            entity = p4runtime_pb2.Entity()
            entity.table_entry.table_id = entry.table_id
            entity.table_entry.is_default_action = True
            query.append(entity)
        installed = {e.table_entry.table_id: e.table_entry for e in client.read(query)}
        updates = []
        for entry in defaults:
            have = installed.get(entry.table_id)
            if have is not None and entry_action(have) == entry_action(entry):
                continue
            update = _Update(type=_Update.MODIFY)
            update.entity.table_entry.CopyFrom(entry)
            updates.append(update)
        return updates

    def recover(self) -> dict[str, ApplyReport]:
        """Every switch whose P4Runtime stream has ended (it restarted, or went away and came
        back) reconnected and given the pipeline and every entry again, as `apply` gives a
        fresh switch; the others are left alone. Raises SwitchUnreachable for one that does
        not answer."""
        lost = [name for name, client in sorted(self.clients.items()) if client.stream_ended]
        reports = {}
        for name in lost:
            self.clients[name].connect()
            reports[name] = self.apply_switch(name)
        return reports

    def apply(self) -> dict[str, ApplyReport]:
        self.connect()
        return {name: self.apply_switch(name) for name in sorted(self.fabric.switches)}

    def counters(self, switch: str) -> dict[int, PortCounters]:
        """Per port of `switch` on a link: what its counters hold."""
        ports = [p for (name, p) in self.fabric.ports if name == switch]
        return entries.read_port_counters(self.clients[switch], self.index, ports)


def switch_defaults(
    fabric: Fabric, index: P4InfoIndex, switch: str
) -> list[p4runtime_pb2.TableEntry]:
    """The default entries `switch` should hold, one per table of DEFAULT_TABLES: the
    switch-wide trim size and queue, and the one trim DSCP for every port. Left at the
    program's defaults they are NoAction, as a freshly pushed pipeline has them."""
    trimming = fabric.trimming
    switch_wide = trimming.switch_trimming
    return [
        entries.switch_trimming(index, None if switch_wide == DEFAULT_TRIMMING else switch_wide),
        entries.trim_dscp_default(index, trimming.static_dscp),
    ]


def eligibility_entries(trimming: Trimming, index: P4InfoIndex) -> list[p4runtime_pb2.TableEntry]:
    """Ineligible traffic classes and DISABLE_TRIM rules (the first one highest), in the
    tables both programs, v1model and TNA, name and key alike."""
    result = [entries.trim_ineligible(index, dscp) for dscp in trimming.ineligible]
    rules = trimming.disable_trim
    for i, rule in enumerate(rules):
        result.append(
            entries.trim_acl(
                index,
                len(rules) - i,
                *(
                    None if net is None else (int(net.network_address), net.prefixlen)
                    for net in (rule.src_ip, rule.dst_ip)
                ),
                rule.dscp,
            )
        )
    return result


def trimming_entries(
    fabric: Fabric, index: P4InfoIndex, switch: str
) -> list[p4runtime_pb2.TableEntry]:
    """The trimming settings `switch` holds in table entries: the eligibility ones, and
    per managed port its trim DSCP (asymmetric DSCP) and its high queue's bound."""
    trimming = fabric.trimming
    result = eligibility_entries(trimming, index)
    for name, port in sorted(fabric.ports):
        if name != switch:
            continue
        if trimming.dscp_value == DSCP_FROM_TC:
            result.append(entries.trim_dscp(index, port, fabric.trim_dscp(switch, port)))
        if trimming.trim_queue_bytes is not None:
            result.append(entries.trim_queue_limit(index, port, trimming.trim_queue_bytes))
    return result


def switch_entries(
    fabric: Fabric, index: P4InfoIndex, switch: str
) -> list[p4runtime_pb2.TableEntry]:
    """The table entries `switch` should hold: thresholds, trimming, ECMP members, then
    routes. The simulator installs the same ones (and `switch_defaults`), so its switches
    route, mark and trim as real ones do."""
    result = [
        entries.port_thresholds(index, port, spec.thresholds)
        for (name, port), spec in sorted(fabric.ports.items())
        if name == switch
    ]
    result += trimming_entries(fabric, index, switch)
    result += [entries.control_queue(index, opcode) for opcode in fabric.control_with_data]
    groups: dict[tuple, int] = {}
    routes = []
    for ip, hops in sorted(fabric.routes(switch).items()):
        if not hops:
            continue
        if len(hops) == 1:
            routes.append(entries.route(index, ip, 32, hops[0].dmac, hops[0].port))
            continue
        members = tuple(hops)
        if members not in groups:
            group = groups[members] = len(groups) + 1
            result.extend(
                entries.ecmp_member(index, group, member, hop.dmac, hop.port)
                for member, hop in enumerate(members)
            )
        routes.append(entries.ecmp_route(index, ip, 32, groups[members], len(members)))
    return result + routes
