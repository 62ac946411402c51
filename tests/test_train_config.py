"""The training configuration goes from the runner to `forgive-train` as one JSON object."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from commands.train import arguments, training_config
from topologies.fabric import plan, preset
from topologies.runner import RunConfig, Workload, _trainer_command
from workload.plan import TrainingConfig


def test_the_runners_command_line_hands_over_the_exact_configuration(tmp_path):
    config = RunConfig(preset("2to1"), seed=7, workload=Workload(steps=5, burst=True))
    fabric_plan = plan(config.fabric)
    files = {h.name: tmp_path / h.name for h in fabric_plan.hosts}
    for rank in range(len(fabric_plan.hosts)):
        cmd = _trainer_command(config, fabric_plan, rank, files, files)
        args = arguments().parse_args(cmd[3:])
        assert training_config(args) == config.training_config(fabric_plan, rank)
        assert training_config(args).seed == 7 and training_config(args).burst_step == 2


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
        ("[1, 2]", "must be a JSON object"),
        ("{", "is not JSON"),
    ],
)
def test_a_bad_configuration_is_one_line_before_anything_starts(config, message):
    result = subprocess.run(
        [sys.executable, "-m", "commands.train", "--iface", "lo", "--config", config],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
