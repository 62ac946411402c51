"""`forgive-ctl sonic`: the config DB fragment holds only SONiC's tables and fields, and sets
the trimming the fabric description asks for, port by port.

The names below are SONiC's, read from the Packet Trimming HLD (sonic-net/SONiC
doc/packet_trimming/packet-trimming-design.md at 0031145f8c78c7597fa3ea1744cfaefb4396cd34,
sections 2.6.1 and 2.6.4), and, where the HLD's samples leave a field out, from SONiC's YANG
models (sonic-buildimage src/sonic-yang-models/yang-models: static_th in
sonic-buffer-profile.yang, DST_IP and DSCP in sonic-acl.yang's ACL_RULE)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commands import ctl as cli
from controller.p4info import ConfigError
from controller.sonic import config_db
from controller.topology import parse

HLD_FIELDS: dict[str, set[str]] = {
    "SWITCH_TRIMMING": {"size", "dscp_value", "tc_value", "queue_index"},
    "BUFFER_PROFILE": {"pool", "size", "dynamic_th", "packet_discard_action"},
    "BUFFER_QUEUE": {"profile"},
    "PORT_QOS_MAP": {"tc_to_dscp_map"},
    "ACL_TABLE_TYPE": {"MATCHES", "ACTIONS", "BIND_POINTS"},
    "ACL_TABLE": {"POLICY_DESC", "TYPE", "STAGE", "PORTS"},
    "ACL_RULE": {"PRIORITY", "SRC_IP", "PACKET_ACTION"},
}
"""Every config DB table of the HLD's trimming samples that carries trimming, with its
fields; TC_TO_DSCP_MAP's fields are traffic classes."""
YANG_FIELDS = {"BUFFER_PROFILE": {"static_th"}, "ACL_RULE": {"DST_IP", "DSCP"}}
HLD_TABLES = {*HLD_FIELDS, "TC_TO_DSCP_MAP", "BUFFER_POOL", "FLEX_COUNTER_TABLE"}
ASYMMETRIC = Path(__file__).resolve().parent.parent / "runplan/fabrics/2to1-asymmetric.toml"


def description(**trimming) -> dict:
    """s1 with hosts on ports 1 and 2 and an uplink on port 3 to s2, which has h3 on port 1."""
    return {
        "switches": {
            "s1": {"target": "model", "grpc": "127.0.0.1:1", "control": "x"},
            "s2": {"target": "model", "grpc": "127.0.0.1:2", "control": "x"},
        },
        "hosts": {f"h{i}": {"ip": f"10.0.0.{i}", "mac": f"02:00:00:00:00:0{i}"} for i in (1, 2, 3)},
        "links": [
            {"a": "h1", "b": "s1:1"},
            {"a": "h2", "b": "s1:2"},
            {"a": "s1:3", "b": "s2:2"},
            {"a": "h3", "b": "s2:1"},
        ],
        "ports": {"s1:3": {"data_queue_bytes": 1 << 20}},
        "trimming": trimming,
    }


EVERY_KNOB = {
    "size": 128,
    "dscp_value": "from-tc",
    "tc_value": 5,
    "tc_to_dscp_map": {"host_trim_map": {"5": 3}, "spine_trim_map": {"5": 7, "1": 9}},
    "port_qos_map": {"host": "host_trim_map", "fabric": "spine_trim_map"},
    "trim_queue_bytes": 4096,
    "packet_discard_action": {"18": "drop", "20": "drop", "10": "trim"},
    "disable_trim": [{"src_ip": "10.0.0.1/32"}, {"dst_ip": "10.0.1.0/24", "dscp": 0}],
}


def check_names(fragment: dict) -> None:
    assert set(fragment) <= HLD_TABLES, set(fragment) - HLD_TABLES
    for table, rows in fragment.items():
        allowed = HLD_FIELDS.get(table, set()) | YANG_FIELDS.get(table, set())
        for key, fields in rows.items():
            if table == "TC_TO_DSCP_MAP":
                assert all(tc.isdecimal() and dscp.isdecimal() for tc, dscp in fields.items())
                continue
            assert set(fields) <= allowed, f"{table}|{key}: {set(fields) - allowed}"
            for name, value in fields.items():
                kind = list if name in ("MATCHES", "ACTIONS", "BIND_POINTS", "PORTS") else str
                assert isinstance(value, kind), f"{table}|{key}.{name} = {value!r}"


def test_every_knob_in_sonic_tables_and_fields():
    fabric = parse(description(**EVERY_KNOB))
    s1 = config_db(fabric, "s1")
    check_names(s1)
    assert s1["SWITCH_TRIMMING"] == {
        "GLOBAL": {"size": "128", "dscp_value": "from-tc", "tc_value": "5", "queue_index": "1"}
    }
    # asymmetric DSCP: host-facing ports to one map, the uplink to the other
    assert s1["PORT_QOS_MAP"] == {
        "Ethernet1": {"tc_to_dscp_map": "host_trim_map"},
        "Ethernet2": {"tc_to_dscp_map": "host_trim_map"},
        "Ethernet3": {"tc_to_dscp_map": "spine_trim_map"},
    }
    assert s1["TC_TO_DSCP_MAP"] == {
        "host_trim_map": {"5": "3"},
        "spine_trim_map": {"1": "9", "5": "7"},
    }
    # the data queue trims past its data_queue_bytes; the high queue is bounded for trims
    queues = s1["BUFFER_QUEUE"]
    profiles = s1["BUFFER_PROFILE"]
    uplink, downlink = (
        profiles[queues["Ethernet3|0"]["profile"]],
        profiles[queues["Ethernet1|0"]["profile"]],
    )
    assert (uplink["static_th"], uplink["packet_discard_action"]) == (str(1 << 20), "trim")
    assert (downlink["static_th"], downlink["packet_discard_action"]) == (str(4 << 20), "trim")
    high = profiles[queues["Ethernet2|1"]["profile"]]
    assert (high["static_th"], high["packet_discard_action"]) == ("4096", "drop")
    assert len(queues) == 6
    # DISABLE_TRIM: the rules in order, then the ineligible classes, bound to every port
    rules = s1["ACL_RULE"]
    assert [r["PACKET_ACTION"] for r in rules.values()] == ["DISABLE_TRIM"] * 4
    priorities = [int(r["PRIORITY"]) for r in rules.values()]
    assert priorities == sorted(priorities, reverse=True)
    assert [
        {k: v for k, v in r.items() if k not in ("PRIORITY", "PACKET_ACTION")}
        for r in rules.values()
    ] == [
        {"SRC_IP": "10.0.0.1/32"},
        {"DST_IP": "10.0.1.0/24", "DSCP": "0"},
        {"DSCP": "18"},
        {"DSCP": "20"},
    ]
    assert all(name.startswith("FORGIVE_TRIM|") for name in rules)
    assert s1["ACL_TABLE"]["FORGIVE_TRIM"]["PORTS"] == ["Ethernet1", "Ethernet2", "Ethernet3"]
    assert s1["ACL_TABLE_TYPE"]["FORGIVE_TRIM"] == {
        "MATCHES": ["DSCP", "DST_IP", "SRC_IP"],
        "ACTIONS": ["DISABLE_TRIM_ACTION"],
        "BIND_POINTS": ["PORT"],
    }
    s2 = config_db(fabric, "s2")
    check_names(s2)
    assert s2["PORT_QOS_MAP"]["Ethernet2"] == {"tc_to_dscp_map": "spine_trim_map"}


def test_a_static_dscp_needs_no_maps_and_no_acl():
    s1 = config_db(parse(description(dscp_value=48, queue_index=0)), "s1")
    check_names(s1)
    assert set(s1) == {"SWITCH_TRIMMING", "BUFFER_PROFILE", "BUFFER_QUEUE"}
    assert s1["SWITCH_TRIMMING"]["GLOBAL"] == {"size": "58", "dscp_value": "48", "queue_index": "0"}
    assert all(key.endswith("|0") for key in s1["BUFFER_QUEUE"])


def test_keeping_the_dscp_has_no_sonic_equivalent():
    with pytest.raises(ConfigError, match='dscp_value "keep" has no SONiC equivalent'):
        config_db(parse(description()), "s1")


def test_forgive_ctl_sonic_exports_a_fabric_file_at_its_own_scale(capsys, tmp_path):
    assert cli.main(["sonic", str(ASYMMETRIC)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"leaf1", "leaf2", "spine1"}
    for fragment in doc.values():
        check_names(fragment)
    leaf = doc["leaf1"]
    assert [leaf["PORT_QOS_MAP"][f"Ethernet{p}"]["tc_to_dscp_map"] for p in (1, 2, 3)] == [
        "host_trim_map",
        "host_trim_map",
        "fabric_trim_map",
    ]
    assert {p["static_th"] for p in leaf["BUFFER_PROFILE"].values()} == {str(4 << 20)}
    spine = doc["spine1"]
    assert set(m["tc_to_dscp_map"] for m in spine["PORT_QOS_MAP"].values()) == {"fabric_trim_map"}
    assert cli.main(["sonic", "2to1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no SONiC equivalent" in err[0]
    path = tmp_path / "fabric.json"
    path.write_text(json.dumps(description(dscp_value=46)))
    assert cli.main(["sonic", str(path), "--switch", "s2"]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["s2"]
