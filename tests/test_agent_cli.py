"""The agent's and the workload's command lines: every bad setting is one line, before any socket."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("program", "bad", "message"),
    [
        ("host_agent.cli", ["--policy", "bogus"], "unknown policy 'bogus'"),
        ("workload.train", ["--policy", "bogus"], "unknown policy 'bogus'"),
        ("host_agent.cli", ["--neighbor", "10.0.0.2"], "expected IP=MAC"),
        ("host_agent.cli", ["--gateway-mac", "02:00"], "not a MAC address"),
        ("host_agent.cli", ["--rto", "0.5", "--rto-max", "0.1"], "rto"),
        ("workload.train", ["--ranks", "10.0.0.1,10.0.0.1"], "own address"),
        ("workload.train", ["--detector", "oracle"], "unknown detector"),
        ("host_agent.cli", ["--dcqcn", "ns3"], "unknown DCQCN profile 'ns3'"),
        ("workload.train", ["--dcqcn", "ns3"], "unknown DCQCN profile 'ns3'"),
        ("workload.train", ["--misclassify", "0,3"], "misclassify: step 0 is outside"),
        pytest.param(
            "host_agent.cli",
            ["--iface", "nosuch0", "--ip", "10.0.0.1"],
            "no interface named",
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="raw sockets need root"),
        ),
        ("host_agent.cli", ["--api", __file__], "exists and is not a socket"),
        ("host_agent.cli", ["--api", "/nonexistent/dir/s"], "no directory"),
    ],
)
def test_bad_configuration_is_one_line_before_anything_starts(program, bad, message, tmp_path):
    args = ["--iface", "lo", "--api", str(tmp_path / "s")]
    if program == "workload.train":
        args = ["--iface", "lo", "--ranks", "10.0.0.1,10.0.0.2", "--rank", "0"]
    result = subprocess.run(
        [sys.executable, "-m", program, *args, *bad], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert not (tmp_path / "s").exists()
