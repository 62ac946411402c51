"""The agent's and the workload's command lines: every bad setting is one line, before any socket."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("program", "bad", "message"),
    [
        ("commands.agent", ["--policy", "bogus"], "unknown policy 'bogus'"),
        ("commands.train", ["--policy", "bogus"], "unknown policy 'bogus'"),
        ("commands.agent", ["--neighbor", "10.0.0.2"], "expected IP=MAC"),
        ("commands.agent", ["--gateway-mac", "02:00"], "not a MAC address"),
        ("commands.agent", ["--rto", "0.5", "--rto-max", "0.1"], "rto"),
        ("commands.train", ["--ranks", "10.0.0.1,10.0.0.1"], "own address"),
        ("commands.train", ["--detector", "oracle"], "unknown detector"),
        ("commands.agent", ["--dcqcn", "ns3"], "unknown DCQCN profile 'ns3'"),
        ("commands.train", ["--dcqcn", "ns3"], "unknown DCQCN profile 'ns3'"),
        ("commands.train", ["--misclassify", "0,3"], "misclassify: step 0 is outside"),
        pytest.param(
            "commands.agent",
            ["--iface", "nosuch0", "--ip", "10.0.0.1"],
            "no interface named",
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="raw sockets need root"),
        ),
        ("commands.agent", ["--api", __file__], "exists and is not a socket"),
        ("commands.agent", ["--api", "/nonexistent/dir/s"], "no directory"),
    ],
)
def test_bad_configuration_is_one_line_before_anything_starts(program, bad, message, tmp_path):
    args = ["--iface", "lo", "--api", str(tmp_path / "s")]
    if program == "commands.train":
        args = ["--iface", "lo", "--ranks", "10.0.0.1,10.0.0.2", "--rank", "0"]
    result = subprocess.run(
        [sys.executable, "-m", program, *args, *bad], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert not (tmp_path / "s").exists()
