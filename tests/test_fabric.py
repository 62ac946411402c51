import pytest

from topologies.fabric import PRESETS, FabricError, load, plan, preset
from topologies.scaling import Scaling, ScalingError


def test_presets_have_the_oversubscription_their_names_say():
    assert preset("nonblocking").oversubscription == 1.0
    assert preset("2to1").oversubscription == 2.0
    assert preset("4to1").oversubscription == 4.0
    assert preset("incast").spines == 0 and preset("incast").host_count == 6
    with pytest.raises(FabricError, match="unknown fabric preset 'x'; presets: nonblocking"):
        preset("x")


def test_scaling_rule():
    sc = Scaling(host_link_bps=20e6, byte_scale=64)
    assert sc.rate_scale == 20_000 and sc.time_scale == pytest.approx(312.5)
    assert sc.rate(400e9) == 20_000_000 and sc.rate(100e9) == 5_000_000
    assert sc.size(4 << 20) == 65536
    assert sc.duration(55e-6) == pytest.approx(55e-6 * 312.5)
    with pytest.raises(ScalingError, match="under 4 frames; lower byte_scale"):
        Scaling(byte_scale=4096).queue(4 << 20, "data_queue_bytes")
    with pytest.raises(ScalingError, match="faster"):
        Scaling(host_link_bps=1e12)


def test_plan_numbers_ports_hosts_first_then_uplinks():
    p = plan(preset("4to1"))
    assert p.switches == ["leaf1", "leaf2", "spine1"]
    assert [h.name for h in p.hosts] == [f"h{i}" for i in range(1, 9)]
    h5 = p.hosts[4]
    assert (h5.ip, h5.mac, h5.leaf, h5.port) == ("10.0.1.1", "02:00:00:00:01:01", "leaf2", 1)
    uplinks = [(lk.a, lk.a_port, lk.b, lk.b_port) for lk in p.links if lk.b.startswith("spine")]
    assert uplinks == [("leaf1", 5, "spine1", 1), ("leaf2", 5, "spine1", 2)]


def test_controller_description_is_scaled():
    p = plan(preset("nonblocking"))
    endpoints = {
        s: {"target": "model", "grpc": f"127.0.0.1:{9000 + i}"} for i, s in enumerate(p.switches)
    }
    desc = p.controller_description(endpoints)
    assert desc["thresholds"] == {
        "data_queue_bytes": 65536,
        "ecn_kmin": 12500,
        "ecn_kmax": 50000,
        "ecn_pmax": 13107,
    }
    assert {link["rate_bps"] for link in desc["links"]} == {20_000_000}
    assert desc["links"][0] == {"a": "h1", "b": "leaf1:1", "rate_bps": 20_000_000}
    with pytest.raises(FabricError, match="no endpoints for switch"):
        p.controller_description({})


def write(tmp_path, text):
    path = tmp_path / "fabric.toml"
    path.write_text(text)
    return path


def test_fabric_file_round_trip(tmp_path):
    spec = load(
        write(
            tmp_path,
            'name = "mine"\nleaves = 3\nspines = 2\nhosts_per_leaf = 2\nspine_link_gbps = 200\n'
            "[switch]\necn_pmax = 0.5\n[emulation]\nhost_link_mbps = 10\nbyte_scale = 32\n",
        )
    )
    assert (spec.name, spec.leaves, spec.spines, spec.oversubscription) == ("mine", 3, 2, 2.0)
    assert spec.switch.ecn_pmax == 0.5 and spec.scaling.host_link_bps == 10e6
    assert plan(spec).links[2].rate_bps == 5_000_000  # 200G uplink at 10M/400G


@pytest.mark.parametrize(
    "text, message",
    [
        ("leaves = 2\nspines = 1\n", r"missing key\(s\) hosts_per_leaf"),
        ("leaves = 2\nspines = 1\nhosts_per_leaf = 2\ncolour = 1\n", r"unknown key\(s\) colour"),
        ('leaves = "2"\nspines = 1\nhosts_per_leaf = 2\n', "leaves must be an integer"),
        ("leaves = 2\nspines = 0\nhosts_per_leaf = 2\n", "needs at least one spine"),
        ("leaves = 1\nspines = 0\nhosts_per_leaf = 1\n", "at least two hosts"),
        (
            "leaves = 2\nspines = 1\nhosts_per_leaf = 2\n[switch]\nqueue = 1\n",
            r"unknown key\(s\) in \[switch\]: queue",
        ),
        (
            "leaves = 2\nspines = 1\nhosts_per_leaf = 2\n[switch]\necn_kmin_bytes = 9000000\n",
            "ecn_kmin_bytes <= ecn_kmax",
        ),
        (
            "leaves = 2\nspines = 1\nhosts_per_leaf = 2\n[emulation]\nbyte_scale = 10000\n",
            "lower byte_scale",
        ),
        (
            "leaves = 2\nspines = 1\nhosts_per_leaf = 2\n[emulation]\nhost_link_mbps = 0\n",
            "rates must be > 0",
        ),
        ("leaves = = 2\n", "not TOML"),
    ],
)
def test_bad_fabric_files_are_rejected_in_one_line(tmp_path, text, message):
    with pytest.raises(FabricError, match=message) as err:
        load(write(tmp_path, text))
    assert "\n" not in str(err.value) and str(err.value).startswith("fabric file ")


def test_missing_fabric_file(tmp_path):
    with pytest.raises(FabricError, match="No such file"):
        load(tmp_path / "nope.toml")


def test_every_preset_plans():
    for name in PRESETS:
        p = plan(preset(name))
        assert len(p.hosts) == p.spec.host_count


def test_rescaling_a_fabric_file_keeps_its_own_shape_even_under_a_preset_name(tmp_path):
    import argparse

    from topologies.cli import _fabric

    path = write(tmp_path, 'name = "2to1"\nleaves = 3\nspines = 2\nhosts_per_leaf = 2\n')
    args = argparse.Namespace(fabric=str(path), host_link_mbps=10.0, byte_scale=None)
    spec = _fabric(args)
    assert (spec.leaves, spec.spines, spec.scaling.host_link_bps) == (3, 2, 10e6)
    args = argparse.Namespace(fabric=str(path), host_link_mbps=None, byte_scale=10_000.0)
    with pytest.raises(FabricError, match="lower byte_scale"):
        _fabric(args)
