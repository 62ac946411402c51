"""The agent's and the workload's command lines: every bad setting is one line, before any socket."""

import argparse
import os
import subprocess
import sys
from dataclasses import fields

import pytest

from commands.agent import agent_arguments, config_from
from host_agent.endpoint import EndpointConfig


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


def test_every_endpoint_setting_has_a_flag_with_the_fields_default():
    """commands.agent makes one flag per EndpointConfig field: none given is the default
    configuration, and each given changes its own field."""
    parser = argparse.ArgumentParser()
    agent_arguments(parser)
    default = EndpointConfig()
    assert config_from(parser.parse_args(["--iface", "lo"])).host.endpoint == default
    given = ["--policy", "dcqcn", "--seed", "3", "--line-rate", "1e9", "--rto", "0.02"]
    given += ["--rto-max", "0.4", "--max-timeouts", "4", "--time-scale", "2", "--no-payload"]
    given += ["--ack-every", "2", "--trim-dscp", "host=3", "--dcqcn", "nic", "--cc", "nscc"]
    given += ["--window-bytes", "9000", "--qp-state", "--payload-bytes", "1000", "--cnp-per-mark"]
    got = config_from(parser.parse_args(["--iface", "lo", *given])).host.endpoint
    assert got == EndpointConfig.from_dict(
        {"policy": "dcqcn", "seed": 3, "line_rate_bps": 1e9, "rto": 0.02, "rto_max": 0.4,
         "max_timeouts": 4, "time_scale": 2.0, "keep_payload": False, "ack_every": 2,
         "trim_locations": {"3": "host"}, "dcqcn": "nic", "cc": "nscc", "window_bytes": 9000.0,
         "qp_state": True, "payload_bytes": 1000, "cnp_per_mark": True}
    )  # fmt: skip
    same = [
        f.name for f in fields(EndpointConfig) if getattr(got, f.name) == getattr(default, f.name)
    ]
    assert same == [], "every field has a flag of its own"
