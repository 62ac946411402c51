"""`forgive run --pcap`: the simulator's captures read by tshark, scapy and forgive-dissect alike,
in time order at fabric scale, bounded by the snap length and the frame cap, and changing nothing
the run records; bad names and bounds refused in one line. (The emulation's captures are checked
on its short run in tests/test_emulation.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from scapy.utils import rdpcap
from tshark_harness import check_capture, needs_tshark

from commands import forgive

SIM_RUN = ["run", "--engine", "sim", "--steps", "2", "--policy", "forgive"]


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """One simulated run with two links captured (one capped) and the same run without."""
    root = tmp_path_factory.mktemp("captures")
    args = [*SIM_RUN, "--pcap", "h1,spine1-leaf1", "--pcap-snaplen", "96", "--out"]
    assert forgive.main([*args, str(root / "with")]) == 0
    plain = [*SIM_RUN, "--out", str(root / "without")]
    assert forgive.main(plain) == 0
    return root


@needs_tshark
def test_tshark_scapy_and_forgive_dissect_read_the_simulators_captures_alike(captured, tmp_path):
    run = captured / "with" / "forgive-seed1"
    for link in ("h1", "leaf1-spine1"):
        rows = check_capture(run / f"{link}.pcapng", tmp_path, snaplen=96)
        times = [r["time"] for r in rows]
        assert times == sorted(times), "frames in time order"
        assert {r["opcode"] for r in rows} >= {"DATA", "ACK"}
    h1 = check_capture(run / "h1.pcapng", tmp_path, snaplen=96)
    assert {r["src"] for r in h1} >= {"10.0.0.1"} and {r["dst"] for r in h1} >= {"10.0.0.1"}


def test_timestamps_are_fabric_time_and_runs_json_is_unchanged(captured):
    (run,) = json.loads((captured / "with" / "runs.json").read_text())
    frames = rdpcap(str(captured / "with" / "forgive-seed1" / "h1.pcapng"))
    fabric_s = run["metrics"]["fabric_training_time_ms"] / 1e3
    last = float(frames[-1].time)
    # the host's link is busy until training ends, on the fabric's clock (the virtual clock is
    # 64 times faster: bytes / 64 at the fabric's own rates)
    assert fabric_s / 2 < last < fabric_s * 1.5
    assert (captured / "with" / "runs.json").read_bytes() == (
        captured / "without" / "runs.json"
    ).read_bytes()


def test_the_frame_cap_bounds_a_capture_and_is_said(tmp_path, capsys):
    out = tmp_path / "capped"
    args = [*SIM_RUN, "--pcap", "h2", "--pcap-frames", "50", "--out", str(out)]
    assert forgive.main(args) == 0
    err = capsys.readouterr().err
    assert len(rdpcap(str(out / "forgive-seed1" / "h2.pcapng"))) == 50
    assert "capture h2: " in err and ", 50 frames cut to 128 bytes; " in err
    assert "more past the cap of 50 frames, not written" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pcap", "h9"], "--pcap: fabric 2to1 has no host or link 'h9': name a host (h1..h4)"),
        (["--pcap", ","], "--pcap needs at least one host, link or all"),
        (["--pcap", "h1", "--pcap-snaplen", "40"], "--pcap-snaplen must lie in 58..262144"),
        (["--pcap", "h1", "--pcap-frames", "0"], "--pcap-frames must be >= 1, got 0"),
    ],
)
def test_bad_captures_are_one_line(tmp_path, args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "commands.forgive", *SIM_RUN, *args, "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_captures_and_the_run_cache_are_refused_together(tmp_path, capsys):
    args = ["compare", "--engine", "sim", "--pcap", "h1", "--cache", str(tmp_path / "c")]
    assert forgive.main([*args, "--out", str(tmp_path / "o")]) == 2
    assert "--pcap and --cache" in capsys.readouterr().err
