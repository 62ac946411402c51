"""A host's part of the run plan goes from the runner to `forgive-train` as one JSON object."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from commands.train import agent_config, arguments, training_config
from runplan.fabric import preset
from runplan.run import RunConfig, Workload, plan_run
from workload.hostplan import HostEntry
from workload.plan import TrainingConfig


def test_the_runners_host_entry_hands_over_the_exact_configuration(tmp_path):
    config = RunConfig(preset("2to1"), seed=7, workload=Workload(steps=5, burst=True))
    run = plan_run(config, tmp_path)
    assert [e.name for e in run.hosts] == [h.name for h in config.rank_hosts(run.fabric)]
    for rank, entry in enumerate(run.hosts):
        back = HostEntry.from_json(entry.to_json())
        assert back == entry
        assert back.training == config.training_config(run.fabric, rank)
        assert back.training.seed == 7 and back.training.burst_step == 2
        agent = agent_config(back)
        assert agent.iface == f"{entry.name}-eth0" and agent.host.ip == back.training.ranks[rank]
        assert agent.host.endpoint == entry.endpoint and agent.stats_path == entry.stats_file
        assert agent.host.gateway_mac == entry.gateway_mac


def assert_refused_in_one_line(args: list[str], message: str) -> None:
    """`forgive-train ARGS` exits 2 with one line on stderr holding `message`."""
    result = subprocess.run(
        [sys.executable, "-m", "commands.train", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("gateway_mac"), "must hold exactly"),
        (lambda d: d["endpoint"].update(rto="fast"), "rto = 'fast' is not float"),
        (lambda d: d["endpoint"].update(policy="lenient"), "unknown policy 'lenient'"),
        (lambda d: d["training"].update(steps=0), "steps"),
        (lambda d: d.update(job="0"), "job = '0' is not"),
    ],
)
def test_a_bad_host_entry_is_one_line_before_anything_starts(tmp_path, change, message):
    entry = json.loads(plan_run(RunConfig(preset("2to1")), tmp_path).hosts[0].to_json())
    change(entry)
    assert_refused_in_one_line(["--host", json.dumps(entry)], message)


def test_flags_override_the_json_and_read_like_the_fields():
    cfg = TrainingConfig(ranks=("10.0.0.1", "10.0.0.2"), rank=1, compute_s=0.002)
    args = arguments().parse_args(
        ["--iface", "lo", "--config", cfg.to_json(), "--steps", "3", "--compute-ms", "7"]
    )
    got = training_config(args)
    assert (got.steps, got.compute_s, got.rank, got.grad_bytes) == (3, 0.007, 1, cfg.grad_bytes)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"ranks": ["10.0.0.1", "10.0.0.2"], "rank": 0, "colour": 1}', "unknown training setting"),
        ('{"ranks": ["10.0.0.1", "10.0.0.2"], "rank": 0, "steps": "9"}', "steps = '9' is not int"),
        ('{"ranks": ["10.0.0.1"], "rank": 0}', "need 2..128 ranks"),
        (
            '{"ranks": ["10.0.0.1", "10.0.0.2"], "rank": 0, "critical": [1, 21]}',
            "critical: step 21 is outside 1..20",
        ),
        ("[1, 2]", "must be a JSON object"),
        ("{", "is not JSON"),
    ],
)
def test_a_bad_configuration_is_one_line_before_anything_starts(config, message):
    assert_refused_in_one_line(["--iface", "lo", "--config", config], message)
