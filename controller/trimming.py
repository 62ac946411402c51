"""The fabric description's trimming section: SAI's packet-trimming knobs under SONiC's names.

    "trimming": {"size": 58,                      SWITCH_TRIMMING|GLOBAL size
                 "dscp_value": "keep",             0..63, "keep" or "from-tc"
                 "tc_value": 5,                    with from-tc: the trim traffic class
                 "tc_to_dscp_map": {"host_trim": {"5": 3}, "fabric_trim": {"5": 7}},
                 "port_qos_map": {"host": "host_trim", "fabric": "fabric_trim"},
                 "queue_index": 1,                 0 the data queue, 1 the high queue
                 "trim_queue_bytes": 4096,         the high queue's bound for trims
                 "packet_discard_action": {"18": "drop"},   per traffic class (DSCP)
                 "disable_trim": [{"src_ip": "10.0.0.1/32", "dst_ip": "10.0.1.0/24",
                                   "dscp": 20}]}  ACL rules, first one highest

Every key is optional and the defaults are the switch as it always was: a
58-byte trim (the FORGIVE headers), the DSCP kept, the high queue, no bound on
it, and every FTH DATA packet eligible. `size` is bytes of the frame a trim
keeps (SAI_SWITCH_ATTR_PACKET_TRIM_SIZE), at least the 58 header bytes; what
it keeps past the FTH is cut payload, which receivers ignore. `dscp_value`
"from-tc" is SAI's asymmetric DSCP: a trimmed packet's DSCP is `tc_value`
looked up in its egress port's TC-to-DSCP map, bound per port role in
`port_qos_map` ("host" for ports facing a host, "fabric" for ports facing a
switch) or per port ("s1:2"). A traffic class is a DSCP of docs/protocol.md;
`packet_discard_action` "drop" makes that class's packets drop rather than
trim when the data queue is full (SAI's per-queue admission-fail action), and
so does a matching `disable_trim` rule (SAI's ACL action). docs/dataplane.md
has the table each knob becomes.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from common.wire import MAX_DSCP
from controller.checks import MAX_BYTES, check_int, check_object, key_path, show
from controller.p4info import ConfigError
from switch_model.port import PRIO_HIGH, PRIO_LOW
from switch_model.surface import DEFAULT_TRIMMING, SwitchTrimming

DSCP_KEEP = "keep"
"""forgive's own default: a trimmed packet keeps its DSCP (SAI has no such mode)."""
DSCP_FROM_TC = "from-tc"
ROLES = ("host", "fabric")
"""Port roles a TC-to-DSCP map binds to: facing a host (the last hop) or another switch."""
DISCARD_ACTIONS = ("drop", "trim")
MAX_TC = 7
MAX_TRIM_SIZE = 9014
"""A jumbo frame (MTU 9000 and its Ethernet header): a larger size cuts nothing more."""
MAX_ACL_RULES = 256
"""trim_acl's size in forgive.p4."""
KEYS = (
    "size",
    "dscp_value",
    "tc_value",
    "tc_to_dscp_map",
    "port_qos_map",
    "queue_index",
    "trim_queue_bytes",
    "packet_discard_action",
    "disable_trim",
)
RULE_KEYS = ("src_ip", "dst_ip", "dscp")


@dataclass(frozen=True)
class AclRule:
    """One DISABLE_TRIM rule; a field left out matches everything."""

    src_ip: ipaddress.IPv4Network | None = None
    dst_ip: ipaddress.IPv4Network | None = None
    dscp: int | None = None


@dataclass(frozen=True)
class Trimming:
    size: int = DEFAULT_TRIMMING.size
    dscp_value: int | str = DSCP_KEEP
    tc_value: int | None = None
    tc_to_dscp_map: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    """(map name, ((tc, dscp), ...)), as written."""
    port_qos_map: tuple[tuple[str, str], ...] = ()
    """(role or SWITCH:PORT, map name), as written."""
    queue_index: int = DEFAULT_TRIMMING.queue_index
    trim_queue_bytes: int | None = None
    """None: the high queue takes every trim."""
    packet_discard_action: tuple[tuple[int, str], ...] = ()
    """(DSCP, "drop" or "trim"); a class not listed trims."""
    disable_trim: tuple[AclRule, ...] = ()

    @property
    def switch_trimming(self) -> SwitchTrimming:
        return SwitchTrimming(self.size, self.queue_index)

    @property
    def static_dscp(self) -> int | None:
        """The one DSCP every trimmed packet gets, if dscp_value names one."""
        return self.dscp_value if isinstance(self.dscp_value, int) else None

    @property
    def ineligible(self) -> list[int]:
        """The traffic classes (DSCPs) that drop instead of trimming."""
        return sorted(dscp for dscp, action in self.packet_discard_action if action == "drop")

    def map_for(self, role: str, port_key: str) -> str | None:
        """The TC-to-DSCP map bound to a port: its own binding, else its role's."""
        bound = dict(self.port_qos_map)
        return bound.get(port_key, bound.get(role))

    def dscp_for(self, role: str, port_key: str) -> int | None:
        """The DSCP a trimmed packet leaving this port gets; None keeps it."""
        if self.dscp_value == DSCP_KEEP:
            return None
        if self.dscp_value != DSCP_FROM_TC:
            return int(self.dscp_value)
        name = self.map_for(role, port_key)
        if name is None:
            return None
        return dict(dict(self.tc_to_dscp_map)[name])[self.tc_value]

    def to_json(self) -> dict:
        """The description's trimming section for these settings (defaults left out)."""
        out: dict = {}
        for key, value, default in (
            ("size", self.size, DEFAULT_TRIMMING.size),
            ("dscp_value", self.dscp_value, DSCP_KEEP),
            ("tc_value", self.tc_value, None),
            ("queue_index", self.queue_index, DEFAULT_TRIMMING.queue_index),
            ("trim_queue_bytes", self.trim_queue_bytes, None),
        ):
            if value != default:
                out[key] = value
        if self.tc_to_dscp_map:
            out["tc_to_dscp_map"] = {
                name: {str(tc): dscp for tc, dscp in pairs} for name, pairs in self.tc_to_dscp_map
            }
        if self.port_qos_map:
            out["port_qos_map"] = dict(self.port_qos_map)
        if self.packet_discard_action:
            out["packet_discard_action"] = {str(d): a for d, a in self.packet_discard_action}
        if self.disable_trim:
            out["disable_trim"] = [
                {
                    key: str(value) if isinstance(value, ipaddress.IPv4Network) else value
                    for key, value in (
                        ("src_ip", rule.src_ip),
                        ("dst_ip", rule.dst_ip),
                        ("dscp", rule.dscp),
                    )
                    if value is not None
                }
                for rule in self.disable_trim
            ]
        return out


DEFAULT = Trimming()


def _number_key(key, where: str, high: int) -> int:
    """A table key that is a number written as text ("5"), as config DB and JSON write it."""
    if not isinstance(key, str) or not key.isdecimal() or not 0 <= int(key) <= high:
        raise ConfigError(f"{where}: key {show(key)} is not a number in 0..{high}")
    return int(key)


def _network(value, where: str) -> ipaddress.IPv4Network:
    try:
        if not isinstance(value, str):
            raise ValueError("not a string")
        return ipaddress.IPv4Network(value)
    except ValueError as err:
        raise ConfigError(
            f"{where} must be an IPv4 prefix A.B.C.D/N, got {show(value)}: {err}"
        ) from None


def _rule(value, where: str) -> AclRule:
    rule = check_object(value, where, RULE_KEYS)
    return AclRule(
        _network(rule["src_ip"], f"{where}.src_ip") if "src_ip" in rule else None,
        _network(rule["dst_ip"], f"{where}.dst_ip") if "dst_ip" in rule else None,
        check_int(rule["dscp"], f"{where}.dscp", 0, MAX_DSCP) if "dscp" in rule else None,
    )


def parse(section, where: str = "trimming") -> Trimming:
    """Check every key of a trimming section; ConfigError names the first bad one. What needs
    the fabric (which ports exist and face what) is checked by `check_ports`."""
    values = check_object(section, where, KEYS)
    size = check_int(
        values.get("size", DEFAULT_TRIMMING.size),
        f"{where}.size",
        DEFAULT_TRIMMING.size,
        MAX_TRIM_SIZE,
    )
    dscp_value = values.get("dscp_value", DSCP_KEEP)
    if dscp_value not in (DSCP_KEEP, DSCP_FROM_TC):
        dscp_value = check_int(
            dscp_value, f'{where}.dscp_value (or "keep", "from-tc")', 0, MAX_DSCP
        )
    from_tc = dscp_value == DSCP_FROM_TC
    for key in ("tc_value", "tc_to_dscp_map", "port_qos_map"):
        if key in values and not from_tc:
            raise ConfigError(f'{where}.{key} takes effect only with dscp_value "from-tc"')
    if from_tc and "tc_value" not in values:
        raise ConfigError(f'{where}.tc_value: dscp_value "from-tc" needs the trim traffic class')
    tc_value = check_int(values["tc_value"], f"{where}.tc_value", 0, MAX_TC) if from_tc else None
    maps = []
    for name, pairs in check_object(
        values.get("tc_to_dscp_map", {}), f"{where}.tc_to_dscp_map"
    ).items():
        at = key_path(f"{where}.tc_to_dscp_map", name)
        entries = tuple(
            sorted(
                (_number_key(tc, at, MAX_TC), check_int(dscp, key_path(at, tc), 0, MAX_DSCP))
                for tc, dscp in check_object(pairs, at).items()
            )
        )
        if tc_value not in dict(entries):
            raise ConfigError(f"{at} maps no DSCP for tc_value {tc_value}")
        maps.append((name, entries))
    bindings = []
    for port, name in check_object(values.get("port_qos_map", {}), f"{where}.port_qos_map").items():
        if not isinstance(name, str) or name not in dict(maps):
            raise ConfigError(
                f"{key_path(where + '.port_qos_map', port)}: no tc_to_dscp_map {show(name)}"
            )
        bindings.append((port, name))
    if from_tc and not bindings:
        raise ConfigError(f'{where}.port_qos_map: dscp_value "from-tc" needs a map bound to ports')
    queue_index = check_int(
        values.get("queue_index", DEFAULT_TRIMMING.queue_index),
        f"{where}.queue_index",
        PRIO_LOW,
        PRIO_HIGH,
    )
    trim_queue_bytes = None
    if "trim_queue_bytes" in values:
        if queue_index != PRIO_HIGH:
            raise ConfigError(
                f"{where}.trim_queue_bytes bounds the high queue (queue_index {PRIO_HIGH}); "
                f"trims to queue {PRIO_LOW} fit the data queue's budget"
            )
        trim_queue_bytes = check_int(
            values["trim_queue_bytes"], f"{where}.trim_queue_bytes", 1, MAX_BYTES
        )
    discard = []
    for dscp, action in check_object(
        values.get("packet_discard_action", {}), f"{where}.packet_discard_action"
    ).items():
        at = f"{where}.packet_discard_action"
        number = _number_key(dscp, at, MAX_DSCP)
        if action not in DISCARD_ACTIONS:
            raise ConfigError(f'{key_path(at, dscp)} must be "drop" or "trim", got {show(action)}')
        discard.append((number, action))
    rules = values.get("disable_trim", [])
    if not isinstance(rules, list):
        raise ConfigError(f"{where}.disable_trim must be a list, got {show(rules)}")
    if len(rules) > MAX_ACL_RULES:
        raise ConfigError(f"{where}.disable_trim: {len(rules)} rules, at most {MAX_ACL_RULES}")
    return Trimming(
        size=size,
        dscp_value=dscp_value,
        tc_value=tc_value,
        tc_to_dscp_map=tuple(maps),
        port_qos_map=tuple(bindings),
        queue_index=queue_index,
        trim_queue_bytes=trim_queue_bytes,
        packet_discard_action=tuple(sorted(discard)),
        disable_trim=tuple(_rule(r, f"{where}.disable_trim[{i}]") for i, r in enumerate(rules)),
    )


def check_ports(
    trimming: Trimming, ports: dict[tuple[str, int], str], where: str = "trimming"
) -> None:
    """`ports` maps every switch port on a link to its role: per-port bindings must name
    such a port, and with from-tc every port must have a map."""
    keys = {f"{switch}:{port}" for switch, port in ports}
    for key, _ in trimming.port_qos_map:
        if key not in ROLES and key not in keys:
            raise ConfigError(
                f"{where}.port_qos_map: {show(key)} is neither a role {ROLES} nor SWITCH:PORT "
                "of a port on a link"
            )
    if trimming.dscp_value != DSCP_FROM_TC:
        return
    for (switch, port), role in sorted(ports.items()):
        if trimming.map_for(role, f"{switch}:{port}") is None:
            raise ConfigError(
                f"{where}.port_qos_map: port {switch}:{port} ({role}-facing) has no tc_to_dscp_map"
            )


def locations(trimming: Trimming, ports: dict[tuple[str, int], str]) -> dict[int, str]:
    """DSCP -> the role of the ports that give trimmed packets that DSCP, for the DSCPs only
    one role's ports use: what a receiver can tell of where its trims happened."""
    if trimming.dscp_value != DSCP_FROM_TC:
        return {}
    roles: dict[int, set[str]] = {}
    for (switch, port), role in ports.items():
        dscp = trimming.dscp_for(role, f"{switch}:{port}")
        if dscp is not None:
            roles.setdefault(dscp, set()).add(role)
    return {dscp: next(iter(r)) for dscp, r in sorted(roles.items()) if len(r) == 1}
