"""The trimming section of a fabric description: its checks, the entries it becomes, and
asymmetric DSCP end to end in virtual time (the receivers tell last-hop trims from fabric ones).

The switch behaviour of every knob is the PTF suite's (ptf_tests/trim_settings.py, on the
model and on BMv2); these tests hold the configuration side and the records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commands.agent import agent_arguments, config_from
from commands.forgive import main
from common import p4names
from common.wire import Flag, Fth, Opcode
from controller.fabric_control import switch_defaults, switch_entries
from controller.p4info import ConfigError, P4InfoIndex, entry_action, load_p4info
from controller.topology import parse
from controller.trimming import DEFAULT
from host_agent.endpoint import Endpoint, EndpointConfig
from host_agent.host import HostConfig
from runplan.fabric import LINK_DELAY_S, FabricError, load, plan, preset, sim_scaling
from runplan.run import RunConfig, Workload, endpoint_config
from simulator.engine import sim_endpoints, train
from switch_model import surface
from switch_model.surface import SwitchTrimming

INDEX = P4InfoIndex(
    load_p4info(Path(__file__).resolve().parent.parent / "p4src/build/forgive.p4info.txtpb")
)
ASYMMETRIC = Path(__file__).resolve().parent.parent / "runplan/fabrics/2to1-asymmetric.toml"
FROM_TC = {
    "dscp_value": "from-tc",
    "tc_value": 5,
    "tc_to_dscp_map": {"host_map": {"5": 3}, "spine_map": {"5": 7}},
    "port_qos_map": {"host": "host_map", "fabric": "spine_map"},
}


def leaf_spine(**trimming) -> dict:
    """h1 on s1:1, s1:2 to s2:1, h2 on s2:2."""
    switches = {
        name: {"target": "model", "grpc": f"127.0.0.1:{i + 1}", "control": "x"}
        for i, name in enumerate(("s1", "s2"))
    }
    desc = {
        "switches": switches,
        "hosts": {
            "h1": {"ip": "10.0.0.1", "mac": "02:00:00:00:00:01"},
            "h2": {"ip": "10.0.1.1", "mac": "02:00:00:00:00:02"},
        },
        "links": [{"a": "h1", "b": "s1:1"}, {"a": "s1:2", "b": "s2:1"}, {"a": "h2", "b": "s2:2"}],
    }
    if trimming:
        desc["trimming"] = trimming
    return desc


def names(entries) -> list[tuple[str, str]]:
    tables = {t.preamble.id: t.preamble.name for t in INDEX.p4info.tables}
    actions = {a.preamble.id: a.preamble.name for a in INDEX.p4info.actions}
    return [(tables[e.table_id], actions[e.action.action.action_id]) for e in entries]


def test_without_a_section_the_switch_trims_as_it_always_did():
    fabric = parse(leaf_spine())
    assert fabric.trimming == DEFAULT
    assert DEFAULT.switch_trimming == surface.DEFAULT_TRIMMING == SwitchTrimming(58, 1)
    trimming_tables = {
        p4names.TRIM_ELIGIBILITY_TABLE,
        p4names.TRIM_ACL_TABLE,
        p4names.TRIM_DSCP_TABLE,
        p4names.TRIM_QUEUE_TABLE,
    }
    for switch in ("s1", "s2"):
        assert not {t for t, _ in names(switch_entries(fabric, INDEX, switch))} & trimming_tables
        defaults = switch_defaults(fabric, INDEX, switch)
        assert names(defaults) == [
            (p4names.SWITCH_TRIMMING_TABLE, p4names.NO_ACTION),
            (p4names.TRIM_DSCP_TABLE, p4names.NO_ACTION),
        ]
    assert fabric.trim_locations() == {}


def test_asymmetric_dscp_resolves_per_port_by_what_it_faces():
    fabric = parse(leaf_spine(**FROM_TC))
    assert fabric.port_roles() == {
        ("s1", 1): "host",
        ("s1", 2): "fabric",
        ("s2", 1): "fabric",
        ("s2", 2): "host",
    }
    assert [fabric.trim_dscp("s1", p) for p in (1, 2)] == [3, 7]
    assert fabric.trim_locations() == {3: "host", 7: "fabric"}
    entries = [
        e
        for e in switch_entries(fabric, INDEX, "s1")
        if e.table_id == INDEX.table_id(p4names.TRIM_DSCP_TABLE)
    ]
    assert sorted(entry_action(e)[1][0][1] for e in entries) == [3, 7]
    # a port's own binding wins over its role's; a DSCP both roles use locates nothing
    own = parse(
        leaf_spine(
            **{
                **FROM_TC,
                "port_qos_map": {"host": "host_map", "fabric": "host_map", "s1:2": "spine_map"},
            }
        )
    )
    assert [own.trim_dscp("s1", 2), own.trim_dscp("s2", 1)] == [7, 3]
    assert own.trim_locations() == {7: "fabric"}


def test_every_knob_becomes_its_entry():
    fabric = parse(
        leaf_spine(
            size=128,
            dscp_value=48,
            queue_index=1,
            trim_queue_bytes=580,
            packet_discard_action={"18": "drop", "10": "trim"},
            disable_trim=[{"src_ip": "10.0.0.0/24", "dscp": 20}, {"dst_ip": "10.0.1.1/32"}],
        )
    )
    entries = switch_entries(fabric, INDEX, "s1")
    got = names(entries)
    assert got.count((p4names.TRIM_ELIGIBILITY_TABLE, p4names.DISABLE_TRIM)) == 1
    assert got.count((p4names.TRIM_QUEUE_TABLE, p4names.SET_TRIM_QUEUE_BYTES)) == 2
    assert (p4names.TRIM_DSCP_TABLE, p4names.SET_TRIM_DSCP) not in got, "one DSCP: the default"
    acl = [e for e in entries if e.table_id == INDEX.table_id(p4names.TRIM_ACL_TABLE)]
    assert [e.priority for e in acl] == [2, 1], "the first rule is the highest"
    src, dscp = acl[0].match
    assert (src.ternary.value, src.ternary.mask) == (
        bytes([10, 0, 0, 0]),
        bytes([255, 255, 255, 0]),
    )
    assert (dscp.ternary.value, dscp.ternary.mask) == (bytes([20]), bytes([63]))
    defaults = switch_defaults(fabric, INDEX, "s1")
    assert [entry_action(e)[1] for e in defaults] == [((1, 128), (2, 1)), ((1, 48),)]
    assert parse(leaf_spine(**fabric.trimming.to_json())).trimming == fabric.trimming


@pytest.mark.parametrize(
    "trimming, message",
    [
        ({"size": 57}, "trimming.size must be an integer in 58..9014"),
        ({"size": "128"}, "trimming.size must be"),
        ({"dscp_value": 64}, "trimming.dscp_value"),
        ({"dscp_value": "from-somewhere"}, "trimming.dscp_value"),
        ({"tc_value": 5}, 'trimming.tc_value takes effect only with dscp_value "from-tc"'),
        ({"dscp_value": "from-tc"}, "trimming.tc_value: dscp_value"),
        (
            {**FROM_TC, "tc_value": 6},
            "trimming.tc_to_dscp_map.host_map maps no DSCP for tc_value 6",
        ),
        ({**FROM_TC, "tc_to_dscp_map": {"host_map": {"9": 1}}}, "not a number in 0..7"),
        (
            {**FROM_TC, "port_qos_map": {"host": "nowhere"}},
            "trimming.port_qos_map.host: no tc_to_dscp_map",
        ),
        (
            {**FROM_TC, "port_qos_map": {"host": "host_map"}},
            r"port s1:2 \(fabric-facing\) has no tc_to_dscp_map",
        ),
        ({**FROM_TC, "port_qos_map": {"s9:1": "host_map"}}, "neither a role"),
        ({"queue_index": 2}, "trimming.queue_index must be an integer in 0..1"),
        ({"queue_index": 0, "trim_queue_bytes": 100}, "bounds the high queue"),
        ({"trim_queue_bytes": 0}, "trimming.trim_queue_bytes must be"),
        ({"packet_discard_action": {"18": "forward"}}, 'must be "drop" or "trim"'),
        ({"packet_discard_action": {"x": "drop"}}, "not a number in 0..63"),
        (
            {"disable_trim": [{"src_ip": "10.0.0.1/24"}]},
            r"disable_trim\[0\].src_ip must be an IPv4 prefix",
        ),
        ({"disable_trim": [{"vlan": 3}]}, r"unknown trimming.disable_trim\[0\] keys"),
        ({"disable_trim": [{}] * 257}, "257 rules, at most 256"),
        ({"colour": 1}, "unknown trimming keys"),
    ],
)
def test_bad_trimming_is_one_config_error_naming_the_key(trimming, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse(leaf_spine(**trimming))
    assert "\n" not in str(err.value)


def test_a_tofino_fabric_takes_the_same_section_and_the_same_checks():
    """One parser for every target (tests/test_controller_tofino.py has the entries)."""
    desc = leaf_spine(size=128, **FROM_TC)
    for spec in desc["switches"].values():
        spec.update(target="tofino", deflect_ports=[0])
        del spec["control"]
    fabric = parse(desc)
    assert fabric.trimming.size == 128
    assert [fabric.trim_dscp("s1", p) for p in (1, 2)] == [3, 7]
    desc["trimming"]["size"] = 57
    with pytest.raises(ConfigError, match=r"trimming\.size must be an integer in 58\.\.9014"):
        parse(desc)


@given(
    st.sampled_from(
        [
            "size",
            "dscp_value",
            "tc_value",
            "queue_index",
            "trim_queue_bytes",
            "packet_discard_action",
            "disable_trim",
            "port_qos_map",
            "tc_to_dscp_map",
        ]
    ),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=8,
    ),
)
def test_any_trimming_value_parses_or_is_one_config_error(key, value):
    try:
        parse(leaf_spine(**{**FROM_TC, key: value}))
    except ConfigError as err:
        assert "\n" not in str(err)


def test_a_fabric_file_passes_trimming_to_the_switches_with_its_queue_scaled(tmp_path):
    spec = load(ASYMMETRIC)
    assert spec.trimming.dscp_value == "from-tc"
    assert plan(spec).fabric().trim_locations() == {3: "host", 7: "fabric"}
    path = tmp_path / "bounded.toml"
    path.write_text(
        "leaves = 1\nspines = 0\nhosts_per_leaf = 2\n[trimming]\ntrim_queue_bytes = 65536\n"
    )
    bounded = load(path)
    assert plan(bounded).trimming().trim_queue_bytes == 65536 // 64
    assert plan(bounded).controller_description({"leaf1": {}})["trimming"] == {
        "trim_queue_bytes": 1024
    }
    for text, message in (
        (
            "[trimming]\ntrim_queue_bytes = 1024\n",
            "scales to 16 B, under one 58-byte trimmed packet",
        ),
        ("[trimming]\nsize = 20\n", r"\[trimming\].size must be"),
        ('[trimming]\ndscp_value = "from-tc"\ntc_value = 1\n', r"\[trimming\].port_qos_map"),
    ):
        path.write_text("leaves = 1\nspines = 0\nhosts_per_leaf = 2\n" + text)
        with pytest.raises(FabricError, match=message) as err:
            load(path)
        assert str(err.value).startswith(f"fabric file {path}")
    assert preset("2to1").trimming == DEFAULT


def test_the_agent_counts_each_trimmed_header_where_its_dscp_says():
    endpoint = Endpoint(EndpointConfig(trim_locations={3: "host", 7: "fabric"}))
    assert {k: v for k, v in endpoint.counters.items() if k.startswith("rx_trims_")} == {
        "rx_trims_host": 0,
        "rx_trims_fabric": 0,
        "rx_trims_unlocated": 0,
    }
    header = Fth(Opcode.DATA, Flag.TRIMMED, 4096, 9, 0, 8192).encode()
    data = Fth(Opcode.DATA, Flag(0), 4, 9, 4096, 8192).encode(b"abcd")
    for dscp in (3, 3, 7, 10):
        endpoint.receive(header, b"\x0a\x00\x00\x01", False, 0.0, dscp)
    endpoint.receive(data, b"\x0a\x00\x00\x01", False, 0.0, 7)  # not trimmed: not counted
    summary = endpoint.summary()
    assert (
        summary["rx_trims_host"],
        summary["rx_trims_fabric"],
        summary["rx_trims_unlocated"],
    ) == (2, 1, 1)
    assert "rx_trims_host" not in Endpoint(EndpointConfig()).summary()
    with pytest.raises(ValueError, match="DSCP 64"):
        EndpointConfig(trim_locations={64: "host"}).validate()


def test_the_agent_takes_trim_locations_on_its_command_line():
    import argparse

    parser = argparse.ArgumentParser()
    agent_arguments(parser)
    args = parser.parse_args(
        ["--iface", "h1-eth0", "--trim-dscp", "host=3", "--trim-dscp", "fabric=7"]
    )
    assert config_from(args).host.endpoint.trim_locations == {3: "host", 7: "fabric"}
    for bad in ("host", "host=x", "host=64"):
        with pytest.raises(ValueError):
            config_from(parser.parse_args(["--iface", "h1-eth0", "--trim-dscp", bad]))


def run_sim(tmp_path: Path, fabric: str, *extra: str) -> dict:
    out = tmp_path / "out"
    assert (
        main(
            [
                "run",
                "--engine",
                "sim",
                "--fabric",
                fabric,
                "--steps",
                "3",
                "--out",
                str(out),
                *extra,
            ]
        )
        == 0
    )
    (run,) = json.loads((out / "runs.json").read_text())
    return run


def test_asymmetric_dscp_end_to_end_the_run_reports_the_split(tmp_path):
    """On 2to1 the ranks' traffic crosses the oversubscribed uplinks: the fabric trims, every
    trimmed header a receiver saw is located, and the run's JSON and table say so."""
    run = run_sim(tmp_path, str(ASYMMETRIC))
    located, acc = run["trims_located"], run["accounting"]
    assert located["fabric"] > 0 and located["unlocated"] == 0
    assert located["host"] + located["fabric"] == acc["trims_seen_by_receivers"] > 0
    assert run["metrics"]["trims_fabric"] == located["fabric"]
    assert run["metrics"]["trims_last_hop"] == located["host"]
    table = (tmp_path / "out" / "table.txt").read_text().splitlines()
    header, row = table[0], table[2]
    column = header.index("fabric trims")
    assert row[column : column + len("fabric trims")].strip() == str(located["fabric"])
    plain = run_sim(tmp_path / "plain", "2to1")
    assert plain["trims_located"] == {} and plain["metrics"]["trims_last_hop"] is None


@pytest.mark.parametrize(
    "placement, burst, trimmed_at", [("interleaved", False, "fabric"), ("packed", True, "host")]
)
def test_each_trim_is_located_at_the_role_of_the_port_that_trimmed_it(placement, burst, trimmed_at):
    """Port by port in virtual time: the trims of the ports facing hosts are exactly the
    headers receivers counted as last-hop trims, and so for the fabric. Interleaved ranks
    cross the uplinks; packed ones with the background burst converge on a host downlink."""
    spec = sim_scaling(load(ASYMMETRIC))
    config = RunConfig(
        spec, workload=Workload(steps=3, burst=burst), placement=placement, engine="sim"
    )
    fabric_plan = plan(spec)
    fabric = parse(fabric_plan.controller_description(sim_endpoints(fabric_plan.switches)))
    delay = LINK_DELAY_S * spec.scaling.time_scale
    host = HostConfig(endpoint=endpoint_config(config, fabric_plan, config.policy, delay))
    index = {h.name: i for i, h in enumerate(fabric_plan.hosts)}
    order = [index[h.name] for h in config.rank_hosts(fabric_plan)]
    cfg = config.training_config(fabric_plan, 0)
    sim, _, _ = train(cfg, fabric, host, delay_s=delay, placement=order)
    at_switches = {"host": 0, "fabric": 0}
    for (switch, port), role in fabric.port_roles().items():
        at_switches[role] += sim.counters[switch].trims[port]
    located = {
        role: sum(h.endpoint.counters[f"rx_trims_{role}"] for h in sim.hosts)
        for role in ("host", "fabric")
    }
    assert located == at_switches and located[trimmed_at] > 0
    assert sum(h.endpoint.counters["rx_trims_unlocated"] for h in sim.hosts) == 0


def test_a_bounded_trim_queue_drops_trims_and_the_run_counts_them(tmp_path):
    """A high queue with room for one trimmed header (3712 B / 64 = 58 B): trims that find
    an ACK or another trim there are dropped, counted, and the run still completes."""
    path = tmp_path / "bounded.toml"
    path.write_text(
        "leaves = 2\nspines = 1\nhosts_per_leaf = 2\n[trimming]\ntrim_queue_bytes = 3712\n"
    )
    run = run_sim(tmp_path, str(path))
    acc = run["accounting"]
    assert run["trim_drops"] == acc["trim_drops_at_switches"] > 0
    assert acc["trims_at_switches"] == acc["trims_sent_at_switches"] + acc["trim_drops_at_switches"]
    assert acc["trims_seen_by_receivers"] == acc["trims_sent_at_switches"]
    assert run["metrics"]["bound_held"] and run["metrics"]["trim_drops"] == run["trim_drops"]


def test_forgive_ctl_counters_trim_prints_sais_three_counters(tmp_path, capsys):
    """Read over P4Runtime from a model switch whose trim counters hold known values."""
    from p4.v1 import p4runtime_pb2
    from switch_harness import device_config, free_tcp_port, p4info_path

    from commands import ctl as cli
    from controller.client import SwitchClient
    from switch_model.dataplane import Dataplane
    from switch_model.p4runtime_server import SwitchService, serve

    address = f"127.0.0.1:{free_tcp_port()}"
    server = serve(SwitchService(1, Dataplane({1: "unused1", 2: "unused2"})), address)
    try:
        (tmp_path / "dev.json").write_bytes(device_config())
        client = SwitchClient("s1", address, 1)
        client.connect()
        client.set_pipeline(INDEX.p4info, device_config(), 1)
        updates = []
        for name, value in (
            (p4names.PORT_TRIMS, 9),
            (p4names.PORT_TRIM_TX, 7),
            (p4names.PORT_TRIM_DROPS, 2),
        ):
            update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
            entry = update.entity.counter_entry
            entry.counter_id = INDEX.counter(name).preamble.id
            entry.index.index = 2
            entry.data.packet_count = value
            updates.append(update)
        client.write(updates)
        client.close()
        desc = {
            "switches": {
                "s1": {"target": "model", "grpc": address, "device_id": 1, "control": "x"}
            },
            "hosts": {
                "h1": {"ip": "10.0.0.1", "mac": "02:00:00:00:00:01"},
                "h2": {"ip": "10.0.0.2", "mac": "02:00:00:00:00:02"},
            },
            "links": [{"a": "h1", "b": "s1:1"}, {"a": "h2", "b": "s1:2"}],
        }
        path = tmp_path / "fabric.json"
        path.write_text(json.dumps(desc))
        args = ["--p4info", str(p4info_path()), "--device-config", str(tmp_path / "dev.json")]
        assert cli.main(["counters", str(path), "--trim", *args]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split() == ["switch", "port", "queue", "trims", "trim_tx", "trim_drops"]
        assert [line.split() for line in lines[1:]] == [
            ["s1", "1", "0", "0", "0", "0"],
            ["s1", "2", "0", "9", "7", "2"],
        ]
    finally:
        server.stop(0).wait()
