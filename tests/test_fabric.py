import tracemalloc

import pytest

from commands.forgive import main
from runplan.fabric import PRESETS, FabricError, load, plan, preset
from runplan.scaling import Scaling, ScalingError


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
    with pytest.raises(
        ScalingError, match=r"under 4 full frames \(4 x 4154 = 16616 B\); lower the byte scale"
    ):
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
            "lower the byte scale",
        ),
        (
            "leaves = 2\nspines = 1\nhosts_per_leaf = 2\n[emulation]\nhost_link_mbps = 0\n",
            "rates must be > 0",
        ),
        ("leaves = = 2\n", "not TOML"),
        (
            "leaves = 2\nspines = 1\nhosts_per_leaf = 2\nhost_link_gbps = inf\n",
            "host_link_gbps must be a finite number, got inf",
        ),
        (
            "leaves = 2\nspines = 1\nhosts_per_leaf = 2\n[emulation]\nbyte_scale = nan\n",
            r"\[emulation\] byte_scale must be a finite number, got nan",
        ),
        (
            "leaves = 2\nspines = 1\nhosts_per_leaf = 2\nspine_link_gbps = 1e-300\n",
            "spine_link_gbps = 1e-300 scales to 5e-296 bit/s, under one 4154-byte frame",
        ),
        (
            "leaves = 2\nspines = 1\nhosts_per_leaf = 2\nhost_link_gbps = 1e300\n",
            r"host_link_gbps must lie in \(0, 10000\]",
        ),
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", r"not TOML \(nested too deep\)"),
        (
            "name = 5\nleaves = 2\nspines = 1\nhosts_per_leaf = 2\n",
            "name must be 1 to 40 letters.*got 5",
        ),
        (
            'name = "../../etc"\nleaves = 2\nspines = 1\nhosts_per_leaf = 2\n',
            r"name must be .* got '\.\./\.\./etc'",
        ),
        ('name = ""\nleaves = 2\nspines = 1\nhosts_per_leaf = 2\n', "name must be"),
        ('name = "a b"\nleaves = 2\nspines = 1\nhosts_per_leaf = 2\n', "name must be"),
        ('name = "' + "x" * 41 + '"\nleaves = 2\nspines = 1\nhosts_per_leaf = 2\n', "name must be"),
        ('name = "fa\\u00efl"\nleaves = 2\nspines = 1\nhosts_per_leaf = 2\n', "name must be"),
        (
            "leaves = 2\nspines = 1\nhosts_per_leaf = 2\n[switch]\ndata_queue_bytes = 10000000000000\n",
            "refused by the controller: thresholds.data_queue_bytes must be an integer in 0..",
        ),
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

    from commands.forgive import _fabric

    path = write(tmp_path, 'name = "2to1"\nleaves = 3\nspines = 2\nhosts_per_leaf = 2\n')
    args = argparse.Namespace(fabric=str(path), host_link_mbps=10.0, byte_scale=None)
    spec = _fabric(args)
    assert (spec.leaves, spec.spines, spec.scaling.host_link_bps) == (3, 2, 10e6)
    args = argparse.Namespace(fabric=str(path), host_link_mbps=None, byte_scale=10_000.0)
    with pytest.raises(FabricError, match="lower the byte scale"):
        _fabric(args)


def test_a_binary_fabric_file_is_not_toml(tmp_path):
    path = tmp_path / "fabric.toml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(FabricError, match=r"fabric file .*: not TOML \(not UTF-8 text"):
        load(path)


def test_a_fabric_file_is_known_by_its_suffix_in_any_case(tmp_path):
    import argparse

    from commands.forgive import _fabric

    path = tmp_path / "WIDE.TOML"
    path.write_text("leaves = 3\nspines = 2\nhosts_per_leaf = 2\n")
    spec = _fabric(argparse.Namespace(fabric=str(path), host_link_mbps=None, byte_scale=None))
    assert (spec.leaves, spec.spines) == (3, 2)


def files(tmp_path) -> dict[str, str]:
    texts = {
        "inf.toml": "leaves = 2\nspines = 1\nhosts_per_leaf = 2\nhost_link_gbps = inf\n",
        "nan.toml": "leaves = 2\nspines = 1\nhosts_per_leaf = 2\n[emulation]\nbyte_scale = nan\n",
        "tiny.toml": "leaves = 2\nspines = 1\nhosts_per_leaf = 2\nspine_link_gbps = 1e-300\n",
    }
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.toml").write_bytes(bytes(range(128, 256)))
    return {name: str(tmp_path / name) for name in [*texts, "binary.toml"]}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--timeout", "nan"], "--timeout must be a finite number > 0, got nan"),
        (["--timeout", "0"], "--timeout must be a finite number > 0, got 0.0"),
        (["--grad-mib", "nan"], "--grad-mib must be a finite number > 0, got nan"),
        (["--compute-ms=-inf"], "--compute-ms must be a finite number >= 0, got -inf"),
        (["--host-link-mbps", "0"], "--host-link-mbps must be a finite number > 0, got 0.0"),
        (["--host-link-mbps", "0.01"], "--host-link-mbps 0.01: host_link_gbps = 400 scales to"),
        (["--byte-scale", "0.5"], "--byte-scale must be a finite number >= 1, got 0.5"),
        (["--fabric", "inf.toml"], "inf.toml: host_link_gbps must be a finite number, got inf"),
        (["--fabric", "nan.toml"], "nan.toml: [emulation] byte_scale must be a finite number"),
        (["--fabric", "binary.toml"], "binary.toml: not TOML (not UTF-8 text"),
        (["--fabric", "tiny.toml"], "tiny.toml: spine_link_gbps = 1e-300 scales to"),
    ],
)
def test_bad_run_options_are_one_line_naming_the_option(
    tmp_path, monkeypatch, capsys, args, message
):
    from commands import forgive as cli

    def started(*_):
        raise AssertionError("a run started")

    monkeypatch.setattr(cli, "run_all", started)
    paths = files(tmp_path)
    args = [paths.get(a, a) for a in args]
    assert cli.main(["run", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("forgive: ")
    assert message in err[0]
    assert "--seeds" not in err[0]


def _peak_bytes(fn):
    """What `fn` allocated at most, in bytes (Python's own allocations, via tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'name = "big"\nleaves = 250\nspines = 1\nhosts_per_leaf = 250\n',
            "250 leaves of 250 hosts make 62500 hosts; every host runs a training rank, and a "
            "job has at most 128",
        ),
        ("# padding\n" * 200_000, "over 1024 KiB, not a fabric file"),
    ],
)
def test_a_huge_fabric_is_refused_in_one_line_with_bounded_memory(tmp_path, capsys, text, message):
    """62,500 hosts had been planned in full (330 MB) before a run refused them; a file
    beyond any fabric's length had been read whole."""
    path = tmp_path / "big.toml"
    path.write_text(text)
    codes = []
    peak = _peak_bytes(
        lambda: codes.append(main(["run", "--engine", "sim", "--fabric", str(path)]))
    )
    assert codes == [2]
    err = capsys.readouterr().err.strip()
    assert err == f"forgive: fabric file {path}: {message}"
    assert peak < 4 << 20, f"{peak / 2**20:.1f} MiB to refuse it"
