"""A fabric's trimming as SONiC config DB: the fragment that sets the same trimming on SONiC.

SONiC's Packet Trimming HLD (sonic-net/SONiC doc/packet_trimming/
packet-trimming-design.md) configures SAI's trimming through config DB tables.
Per switch, `config_db` writes:

- SWITCH_TRIMMING|GLOBAL: size, dscp_value (a number, or "from-tc" with
  tc_value), queue_index;
- BUFFER_PROFILE with packet_discard_action "trim" for the data queue, its
  static_th the port's data_queue_bytes (the threshold past which forgive.p4
  trims), and, for a bounded trim queue, one with packet_discard_action "drop"
  and static_th trim_queue_bytes; BUFFER_QUEUE binds them to each port's
  queue 0 (data) and 1 (high), forgive's two queue indices;
- TC_TO_DSCP_MAP and PORT_QOS_MAP (tc_to_dscp_map) for asymmetric DSCP;
- ACL_TABLE_TYPE, ACL_TABLE and ACL_RULE with PACKET_ACTION DISABLE_TRIM: one
  rule per disable_trim rule, and one per traffic class whose
  packet_discard_action is drop (SONiC sets eligibility per queue; forgive's
  classes share the data queue, so a class is made ineligible by matching its
  DSCP).

Ports are named EthernetN for forgive's port N; profiles draw from the
platform's egress_lossy_pool, which the fragment does not define. What SONiC
cannot express is refused: forgive's default of keeping the DSCP (SAI rewrites
every trimmed packet's DSCP). docs/dataplane.md maps the knobs one by one.
"""

from __future__ import annotations

from common.wire import MAX_DSCP
from controller.p4info import ConfigError
from controller.topology import Fabric
from controller.trimming import DSCP_FROM_TC, DSCP_KEEP
from switch_model.port import PRIO_HIGH, PRIO_LOW

POOL = "egress_lossy_pool"
ACL_TABLE = "FORGIVE_TRIM"
DISABLE_TRIM = "DISABLE_TRIM"
RULE_PRIORITY_TOP = 9999
"""SONiC ACL priorities run high to low; forgive's first rule gets the highest."""
MATCH_FIELDS = (("src_ip", "SRC_IP"), ("dst_ip", "DST_IP"), ("dscp", "DSCP"))
"""forgive's ACL rule keys and SONiC's ACL match fields."""
_RULE_FIELDS = {"PRIORITY", "PACKET_ACTION"}
"""An ACL rule's fields that are not matches."""


def port_name(port: int) -> str:
    return f"Ethernet{port}"


def _switch_trimming(fabric: Fabric) -> dict[str, str]:
    trimming = fabric.trimming
    if trimming.dscp_value == DSCP_KEEP:
        raise ConfigError(
            'trimming.dscp_value "keep" has no SONiC equivalent (SAI rewrites every trimmed '
            'packet\'s DSCP): set a DSCP or "from-tc" to export'
        )
    fields = {"size": str(trimming.size), "dscp_value": str(trimming.dscp_value)}
    if trimming.dscp_value == DSCP_FROM_TC:
        fields["tc_value"] = str(trimming.tc_value)
    fields["queue_index"] = str(trimming.queue_index)
    return fields


def config_db(fabric: Fabric, switch: str) -> dict[str, dict]:
    """The config DB fragment for `switch`, table by table (values are strings, as in
    config_db.json; lists where SONiC's schema takes lists)."""
    trimming = fabric.trimming
    ports = sorted(p for name, p in fabric.ports if name == switch)
    out: dict[str, dict] = {"SWITCH_TRIMMING": {"GLOBAL": _switch_trimming(fabric)}}
    every_class_drops = len(trimming.ineligible) == MAX_DSCP + 1
    profiles: dict[str, dict[str, str]] = {}
    queues: dict[str, dict[str, str]] = {}
    for port in ports:
        data_bytes = fabric.ports[switch, port].thresholds.data_queue_bytes
        name = f"forgive_data_{data_bytes}"
        profiles[name] = {
            "pool": POOL,
            "size": "0",
            "static_th": str(data_bytes),
            "packet_discard_action": "drop" if every_class_drops else "trim",
        }
        queues[f"{port_name(port)}|{PRIO_LOW}"] = {"profile": name}
        if trimming.trim_queue_bytes is not None:
            name = f"forgive_trim_{trimming.trim_queue_bytes}"
            profiles[name] = {
                "pool": POOL,
                "size": "0",
                "static_th": str(trimming.trim_queue_bytes),
                "packet_discard_action": "drop",
            }
            queues[f"{port_name(port)}|{PRIO_HIGH}"] = {"profile": name}
    out["BUFFER_PROFILE"] = profiles
    out["BUFFER_QUEUE"] = queues
    if trimming.dscp_value == DSCP_FROM_TC:
        roles = fabric.port_roles()
        bound = {port_name(p): trimming.map_for(roles[switch, p], f"{switch}:{p}") for p in ports}
        maps = dict(trimming.tc_to_dscp_map)
        out["TC_TO_DSCP_MAP"] = {
            name: {str(tc): str(dscp) for tc, dscp in maps[name]}
            for name in sorted(set(bound.values()))
        }
        out["PORT_QOS_MAP"] = {port: {"tc_to_dscp_map": name} for port, name in bound.items()}
    rules = _acl_rules(fabric)
    if rules:
        matches = sorted({field for rule in rules.values() for field in rule} - _RULE_FIELDS)
        out["ACL_TABLE_TYPE"] = {
            ACL_TABLE: {
                "MATCHES": matches,
                "ACTIONS": ["DISABLE_TRIM_ACTION"],
                "BIND_POINTS": ["PORT"],
            }
        }
        out["ACL_TABLE"] = {
            ACL_TABLE: {
                "POLICY_DESC": "forgive: drop, not trim",
                "TYPE": ACL_TABLE,
                "STAGE": "INGRESS",
                "PORTS": [port_name(p) for p in ports],
            }
        }
        out["ACL_RULE"] = rules
    return out


def _acl_rules(fabric: Fabric) -> dict[str, dict[str, str]]:
    """forgive's disable_trim rules in order, then its ineligible classes as DSCP rules."""
    trimming = fabric.trimming
    rules: dict[str, dict[str, str]] = {}
    priority = RULE_PRIORITY_TOP
    for i, rule in enumerate(trimming.disable_trim, 1):
        fields = {"PRIORITY": str(priority)}
        for key, sonic in MATCH_FIELDS:
            value = getattr(rule, key)
            if value is not None:
                fields[sonic] = str(value)
        fields["PACKET_ACTION"] = DISABLE_TRIM
        rules[f"{ACL_TABLE}|RULE_{i}"] = fields
        priority -= 1
    if len(trimming.ineligible) <= MAX_DSCP:
        for dscp in trimming.ineligible:
            rules[f"{ACL_TABLE}|CLASS_{dscp}"] = {
                "PRIORITY": str(priority),
                "DSCP": str(dscp),
                "PACKET_ACTION": DISABLE_TRIM,
            }
            priority -= 1
    return rules
