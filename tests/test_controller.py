"""forgive-ctl against real model switches over real gRPC, and its description checks."""

from __future__ import annotations

import copy
import json

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from p4.v1 import p4runtime_pb2
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from switch_harness import (
    NETNS,
    ModelProcess,
    VethSet,
    device_config,
    free_tcp_port,
    p4info_path,
)

from commands import ctl as cli
from common import p4names
from common.wire import FORGIVE_UDP_PORT
from controller.client import SwitchClient, SwitchUnreachable
from controller.fabric_control import FabricController
from controller.p4info import ConfigError
from controller.shaping import bmv2_commands
from controller.topology import PortSpec, parse, switch_port_mac
from switch_model.dataplane import Dataplane
from switch_model.p4runtime_server import SwitchService, serve


def netns(test):
    """Veths and raw sockets: run under the namespace lock, skipped where they cannot run."""
    for mark in NETNS:
        test = mark(test)
    return test


H1_MAC, H2_MAC = "02:00:00:00:01:01", "02:00:00:00:02:02"


def description(s1: ModelProcess, s2: ModelProcess, **extra) -> dict:
    return {
        "switches": {
            "s1": {"target": "model", "grpc": s1.grpc, "device_id": 1, "control": s1.control},
            "s2": {"target": "model", "grpc": s2.grpc, "device_id": 2, "control": s2.control},
        },
        "hosts": {
            "h1": {"ip": "10.0.1.1", "mac": H1_MAC},
            "h2": {"ip": "10.0.2.2", "mac": H2_MAC},
        },
        "links": [
            {"a": "h1", "b": "s1:1", "rate_bps": 500_000_000},
            {"a": "s1:2", "b": "s2:1"},
            {"a": "s1:3", "b": "s2:2"},
            {"a": "s2:3", "b": "h2"},
        ],
        **extra,
    }


class Fabric:
    def __init__(self, veths: VethSet, tmp_path):
        self.veths = veths
        self.tmp_path = tmp_path
        p = veths.pairs
        self.s1 = ModelProcess(
            {1: p[1].switch_end, 2: p[2].switch_end, 3: p[3].switch_end},
            name="s1",
            device_id=1,
            workdir=tmp_path,
        )
        self.s2 = ModelProcess(
            {1: p[2].test_end, 2: p[3].test_end, 3: p[4].switch_end},
            name="s2",
            device_id=2,
            workdir=tmp_path,
        )

    def write(self, desc: dict) -> str:
        path = self.tmp_path / "fabric.json"
        path.write_text(json.dumps(desc))
        return str(path)

    def controller(self, **extra) -> FabricController:
        return FabricController(
            parse(description(self.s1, self.s2, **extra)), p4info_path(), self.tmp_path / "dev.json"
        )


@pytest.fixture
def fabric(tmp_path):
    (tmp_path / "dev.json").write_bytes(device_config())
    with VethSet(4) as veths:
        f = Fabric(veths, tmp_path)
        try:
            f.s1.start()
            f.s2.start()
            yield f
        finally:
            f.s1.stop()
            f.s2.stop()


def frame(sport: int) -> bytes:
    return bytes(
        Ether(src=H1_MAC, dst="02:00:00:00:ff:ff")
        / IP(src="10.0.1.1", dst="10.0.2.2")
        / UDP(sport=sport, dport=FORGIVE_UDP_PORT, chksum=0)
        / bytes([0x11, 0, 0, 100])
        / bytes(12)
    )


def read_tables(controller: FabricController, switch: str) -> list:
    return controller.clients[switch].read(
        [p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())]
    )


@netns
def test_apply_installs_routes_ecmp_and_thresholds_and_is_idempotent(fabric):
    ctl = fabric.controller()
    try:
        first = ctl.apply()
        assert first["s1"].pipeline_pushed and first["s2"].pipeline_pushed
        # s1: 3 threshold entries, a 2-member ECMP group towards h2, 2 routes
        assert (first["s1"].inserted, first["s2"].inserted) == (3 + 2 + 2, 3 + 2 + 2)
        again = ctl.apply()
        assert all(
            (r.pipeline_pushed, r.inserted, r.modified, r.deleted) == (False, 0, 0, 0)
            for r in again.values()
        )
        entries = read_tables(ctl, "s1")
        names = {t.preamble.id: t.preamble.name for t in ctl.p4info.tables}
        assert sorted(names[e.table_entry.table_id] for e in entries).count(p4names.ECMP_TABLE) == 2
        stats = fabric.s1.stats()["ports"]
        assert stats["1"]["rate_bps"] == 500_000_000 and stats["2"]["rate_bps"] == 0
    finally:
        ctl.close()
    changed = fabric.controller(
        ports={"s1:2": {"ecn_kmin": 1000}}, thresholds={"ecn_kmax": 2_000_000}
    )
    try:
        report = changed.apply()
        assert (report["s1"].inserted, report["s1"].modified, report["s1"].deleted) == (0, 3, 0)
    finally:
        changed.close()
    smaller = description(fabric.s1, fabric.s2)
    del smaller["hosts"]["h2"]
    smaller["links"] = [link for link in smaller["links"] if link["b"] != "h2"]
    shrunk = FabricController(parse(smaller), p4info_path(), fabric.tmp_path / "dev.json")
    try:
        report = shrunk.apply()
        # s1 loses its route to h2 and that ECMP group's two members; s2 its route to h2 and
        # the thresholds of the port h2 hung off
        assert (report["s1"].deleted, report["s2"].deleted) == (3, 2)
        assert len(read_tables(shrunk, "s1")) == 3 + 1
    finally:
        shrunk.close()


@netns
def test_traffic_crosses_the_configured_fabric_over_both_paths(fabric):
    ctl = fabric.controller()
    try:
        ctl.apply()
        h1, h2 = fabric.veths.pairs[1], fabric.veths.pairs[4]
        for sport in range(40000, 40040):
            h1.send(frame(sport))
        got = h2.receive(timeout=1.0, count=40)
        assert len(got) == 40
        assert all(Ether(f).dst == H2_MAC and Ether(f)[IP].ttl == 62 for f in got)
        rows = ctl.counters("s1")
        assert rows[2].tx_packets > 0 and rows[3].tx_packets > 0
        assert rows[2].tx_packets + rows[3].tx_packets == 40
        assert ctl.counters("s2")[3].tx_packets == 40
        sources = {int(Ether(f).src.replace(":", ""), 16) for f in got}
        assert sources == {switch_port_mac("s2", 1), switch_port_mac("s2", 2)}
    finally:
        ctl.close()


@netns
def test_counters_command_prints_a_table(fabric, capsys):
    path = fabric.write(description(fabric.s1, fabric.s2))
    args = ["--p4info", str(p4info_path()), "--device-config", str(fabric.tmp_path / "dev.json")]
    assert cli.main(["apply", path, *args]) == 0
    fabric.veths.pairs[1].send(frame(40000))
    fabric.veths.pairs[4].receive(timeout=1.0, count=1)
    capsys.readouterr()
    assert cli.main(["counters", path, "--switch", "s2", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "switch",
        "port",
        "tx_packets",
        "tx_bytes",
        "ce_marks",
        "trims",
        "drops",
    ]
    row = {int(line.split()[1]): line.split() for line in lines[1:]}
    assert row[3][2] == "1" and int(row[3][3]) == 58


@netns
def test_switch_restart_is_picked_up_by_the_same_controller(fabric):
    ctl = fabric.controller()
    try:
        ctl.apply()
        fabric.s2.stop()
        fabric.s2.start()
        report = ctl.apply()
        assert report["s2"].pipeline_pushed and report["s2"].inserted == 7
        assert not report["s1"].pipeline_pushed and report["s1"].inserted == 0
        fabric.veths.pairs[1].send(frame(40001))
        assert len(fabric.veths.pairs[4].receive(timeout=1.0, count=1)) == 1
    finally:
        ctl.close()


@netns
def test_unreachable_switch_stops_the_run_before_any_write(fabric, capsys):
    fabric.s2.stop()
    path = fabric.write(description(fabric.s1, fabric.s2))
    args = ["--p4info", str(p4info_path()), "--device-config", str(fabric.tmp_path / "dev.json")]
    assert cli.main(["apply", path, *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s2" in err[0] and "did not answer" in err[0]
    probe = fabric.controller()
    try:
        probe.clients["s1"].connect()
        with pytest.raises(grpc.RpcError) as err:
            probe.clients["s1"].get_pipeline()
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        probe.close()


def test_bad_descriptions_are_one_line_errors(tmp_path, capsys):
    good = {
        "switches": {
            "s1": {"target": "model", "grpc": f"127.0.0.1:{free_tcp_port()}", "control": "/tmp/x"}
        },
        "hosts": {"h1": {"ip": "10.0.0.1", "mac": "02:00:00:00:00:01"}},
        "links": [{"a": "h1", "b": "s1:1"}],
    }
    parse(good)
    cases = [
        ({"switches": {"s1": {"target": "tofino3", "grpc": "x:1"}}}, "target"),
        ({"hosts": {"h1": {"ip": "10.0.0.300", "mac": "02:00:00:00:00:01"}}}, "bad IPv4"),
        ({"links": [{"a": "h1", "b": "s9:1"}]}, "neither a host"),
        ({"links": [{"a": "h1", "b": "s1:1"}, {"a": "s1:1", "b": "h1"}]}, "two links"),
        ({"thresholds": {"ecn_kmin": 10, "ecn_kmax": 5}}, "exceeds ecn_kmax"),
        ({"thresholds": {"ecn_pmax": 70000}}, "65536"),
        ({"ports": {"s1:7": {"ecn_kmin": 1}}}, "not on any link"),
        ({"colour": "blue"}, "unknown topology keys"),
    ]
    for change, message in cases:
        with pytest.raises(ConfigError, match=message):
            parse({**good, **change})
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    assert cli.main(["apply", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("forgive-ctl: topology") and "not JSON" in err[0]
    path.write_text(json.dumps(good))
    assert cli.main(["apply", str(path), "--p4info", str(tmp_path / "none.txtpb")]) == 2
    assert "cannot read P4Info" in capsys.readouterr().err


def test_bmv2_shaping_is_in_packets_of_a_full_data_frame():
    """The data queue holds full DATA frames, and is paced in them plus the 58-byte control
    packet each shares the line with (docs/dataplane.md, "Queueing on the two targets")."""
    spec = PortSpec(
        (1, 2, 3, 4), rate_bps=1_000_000_000, low_queue_bytes=4 << 20, high_queue_bytes=None
    )
    data_queue = [c for c in bmv2_commands(3, spec) if c.endswith(" 3 0")]
    assert data_queue == ["set_queue_rate 29677 3 0", "set_queue_depth 1010 3 0"]


def test_bmv2_paces_the_high_queue_in_trimmed_headers():
    """BMv2 paces each priority queue on its own, in packets: the high queue's packets are
    58-byte headers, so it is paced and sized in those, not in full DATA frames."""
    spec = PortSpec(
        (1, 2, 3, 4), rate_bps=20_000_000, low_queue_bytes=None, high_queue_bytes=58_000
    )
    assert bmv2_commands(3, spec) == [
        "set_queue_rate 594 3 0",
        "set_queue_rate 43103 3 1",
        "set_queue_depth 1000 3 1",
    ]


def test_unreachable_address_gives_a_clear_error():
    with pytest.raises(SwitchUnreachable, match=r"s9 at 127\.0\.0\.1:\d+ did not answer"):
        SwitchClient("s9", f"127.0.0.1:{free_tcp_port()}", timeout=0.5).connect()


def test_a_reconnect_to_a_switch_whose_process_exited_stops_waiting():
    """The emulation's runner tells the client when the switch's process has exited: the
    reconnect gives up at once, not after its timeout (a dead switch's counters read waited
    5 s, and the flows through it gave up before the restart)."""
    checks = []

    def gone() -> bool:
        checks.append(True)
        return len(checks) >= 3

    client = SwitchClient("s9", f"127.0.0.1:{free_tcp_port()}", timeout=60, gone=gone)
    with pytest.raises(SwitchUnreachable, match=r"s9 at 127\.0\.0\.1:\d+: its process has exited"):
        client.connect()
    assert len(checks) == 3 and client.channel is None


@netns
def test_wrong_control_socket_is_refused_before_any_write(fabric, capsys):
    desc = description(fabric.s1, fabric.s2)
    desc["switches"]["s2"]["control"] = str(fabric.tmp_path / "nowhere.sock")
    path = fabric.write(desc)
    args = ["--p4info", str(p4info_path()), "--device-config", str(fabric.tmp_path / "dev.json")]
    assert cli.main(["apply", path, *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s2" in err[0] and "control socket" in err[0]
    probe = SwitchClient("s1", fabric.s1.grpc, 1, election_id=2)
    try:
        probe.connect()
        with pytest.raises(grpc.RpcError) as missing:
            probe.get_pipeline()
        assert missing.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        probe.close()


def two_hosts(grpc_address: str) -> dict:
    return {
        "switches": {"s1": {"target": "model", "grpc": grpc_address, "control": "/tmp/x"}},
        "hosts": {
            "h1": {"ip": "10.0.0.1", "mac": "02:00:00:00:00:01"},
            "h2": {"ip": "10.0.0.2", "mac": "02:00:00:00:00:02"},
        },
        "links": [{"a": "h1", "b": "s1:1"}, {"a": "h2", "b": "s1:2"}],
    }


def changed(path: tuple, value) -> bytes:
    desc = two_hosts("ADDRESS")
    node = desc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(desc).encode()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "is not JSON: 'utf-8' codec can't decode"),
        (b"[" * 100_000 + b"]" * 100_000, "is not JSON: nested too deep"),
        (changed(("switches", "s1", "device_id"), 2**70), "switches.s1.device_id must be"),
        (changed(("thresholds",), [4194304, 800000]), "thresholds must be an object, got [41"),
        (changed(("thresholds",), "4194304"), "thresholds must be an object, got '41"),
        (changed(("hosts", "h2", "ip"), "10.0.0.1"), "hosts.h2.ip 10.0.0.1 is also h1's"),
        (changed(("hosts", "h2", "mac"), "02:00:00:00:00:01"), "hosts.h2.mac 02:00:00:00:00:01"),
        (changed(("links", 0, "rate_bps"), 1e30), "links[0].rate_bps must be an integer in 1.."),
        (changed(("switches", "s1", "grpc"), "nowhere"), "switches.s1.grpc must be HOST:PORT"),
        (changed(("links", 1, "speed"), 5), "unknown links[1] keys ['speed']"),
        (changed(("ports",), {"s1:1": {"ecn_kmin": -1}}), "ports.s1:1.ecn_kmin must be"),
    ],
)
def test_a_bad_description_file_is_one_line_and_status_2_before_any_switch_is_touched(
    tmp_path, capsys, content, message
):
    service = SwitchService(1, Dataplane({1: "unused1", 2: "unused2"}))
    address = f"127.0.0.1:{free_tcp_port()}"
    server = serve(service, address)
    try:
        path = tmp_path / "fabric.json"
        path.write_bytes(content.replace(b"ADDRESS", address.encode()))
        args = ["--p4info", str(p4info_path()), "--device-config", str(tmp_path / "dev.json")]
        (tmp_path / "dev.json").write_bytes(device_config())
        assert cli.main(["apply", str(path), *args]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"forgive-ctl: topology {path}")
        assert message in err[0]
        assert service.config is None and service.arbitration.highest is None
    finally:
        server.stop(0).wait()


KEYS = st.sampled_from(
    [
        *("switches", "hosts", "links", "thresholds", "queues", "ports", "s1", "h1", "h2"),
        *("target", "grpc", "device_id", "control", "thrift_port", "ip", "mac", "a", "b"),
        *("rate_bps", "ecn_kmin", "ecn_kmax", "ecn_pmax", "data_queue_bytes", "s1:1"),
        *("low_queue_bytes", "high_queue_bytes"),
    ]
)
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=4)
    | st.sampled_from(["model", "bmv2", "10.0.0.9", "02:00:00:00:00:09", "h1", "s1:3", "x:1"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=12,
)
PATHS = [
    (),
    ("switches",),
    ("switches", "s1"),
    ("switches", "s1", "target"),
    ("switches", "s1", "device_id"),
    ("switches", "s1", "grpc"),
    ("hosts",),
    ("hosts", "h1"),
    ("hosts", "h2", "ip"),
    ("links",),
    ("links", 0),
    ("links", 1, "rate_bps"),
    ("thresholds",),
    ("queues",),
    ("ports",),
    ("ports", "s1:1"),
]


@given(st.sampled_from(PATHS), st.booleans(), KEYS, VALUES)
def test_any_change_to_a_description_parses_or_is_one_config_error(path, replace, key, value):
    """Replace the value at `path`, or add `key` (or a list element) under it."""
    desc = {
        **two_hosts("127.0.0.1:1"),
        "thresholds": {"ecn_kmin": 1000},
        "queues": {"low_queue_bytes": 65536},
        "ports": {"s1:1": {"ecn_kmax": 5000}},
    }
    desc["links"][1]["rate_bps"] = 10**9
    desc["switches"]["s1"]["device_id"] = 3
    node = desc
    for step in path[:-1]:
        node = node[step]
    target = node[path[-1]] if path else desc
    if isinstance(target, dict) and not replace:
        target[key] = value
    elif isinstance(target, list) and not replace:
        target.append(value)
    elif path:
        node[path[-1]] = value
    else:
        desc = value
    try:
        parse(copy.deepcopy(desc))
    except ConfigError as err:
        assert "\n" not in str(err)


@netns
def test_counters_need_no_mastership_and_a_second_writer_is_refused(fabric, capsys):
    """While a controller (the runner's, say) holds the switches, `counters` still reads
    them, and a second `apply` is refused in one line instead of taking them over."""
    path = fabric.write(description(fabric.s1, fabric.s2))
    args = ["--p4info", str(p4info_path()), "--device-config", str(fabric.tmp_path / "dev.json")]
    holder = fabric.controller()
    try:
        holder.apply()
        fabric.veths.pairs[1].send(frame(40000))
        fabric.veths.pairs[4].receive(timeout=1.0, count=1)
        capsys.readouterr()
        assert cli.main(["counters", path, "--switch", "s2", *args]) == 0
        lines = capsys.readouterr().out.splitlines()
        row = {int(line.split()[1]): line.split() for line in lines[1:]}
        assert row[3][2] == "1"
        assert cli.main(["apply", path, *args]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "s1" in err[0] and "another controller" in err[0], err
        # the holder is still primary: its writes go through
        assert holder.apply()["s1"].pipeline_pushed is False
        holder.clients["s1"].write([])
    finally:
        holder.close()


def three_switches_of(hosts_per_switch: int, addresses: list[str]) -> dict:
    """s1 - s2 - s3 in a line, each with `hosts_per_switch` hosts: every switch routes to
    every host, one ipv4_lpm entry each."""
    desc: dict = {"switches": {}, "hosts": {}, "links": []}
    for s, address in enumerate(addresses, start=1):
        desc["switches"][f"s{s}"] = {"target": "model", "grpc": address, "device_id": s,
                                     "control": "/tmp/x"}  # fmt: skip
        for h in range(1, hosts_per_switch + 1):
            n = (s - 1) * hosts_per_switch + h
            name = f"h{n}"
            desc["hosts"][name] = {"ip": f"10.{s}.{h >> 8}.{h & 255}", "mac": f"02:00:00:00:{n >> 8:02x}:{n & 255:02x}"}  # fmt: skip
            desc["links"].append({"a": name, "b": f"s{s}:{h}"})
    up = hosts_per_switch + 1
    desc["links"] += [{"a": f"s1:{up}", "b": f"s2:{up}"}, {"a": f"s2:{up + 1}", "b": f"s3:{up}"}]
    return desc


def test_a_fabric_that_overflows_a_table_is_refused_before_any_write(tmp_path, capsys):
    """1,200 hosts on 3 switches: 1,200 routes per switch where ipv4_lpm holds 1,024. The
    P4Info gives the size, so the refusal comes before any switch is touched, naming the
    switch and the table (a switch would refuse only the entries past the 1,024th)."""
    services = [SwitchService(s, Dataplane({1: "unused1"})) for s in (1, 2, 3)]
    addresses = [f"127.0.0.1:{free_tcp_port()}" for _ in services]
    servers = [serve(service, a) for service, a in zip(services, addresses, strict=True)]
    try:
        path = tmp_path / "fabric.json"
        path.write_text(json.dumps(three_switches_of(400, addresses)))
        (tmp_path / "dev.json").write_bytes(device_config())
        args = ["--p4info", str(p4info_path()), "--device-config", str(tmp_path / "dev.json")]
        assert cli.main(["apply", str(path), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"forgive-ctl: switch s1: table {p4names.LPM_TABLE} holds 1024 entries, the fabric "
            "needs 1200 there"
        )
        assert all(s.config is None and s.arbitration.highest is None for s in services)
    finally:
        for server in servers:
            server.stop(0).wait()
