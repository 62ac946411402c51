"""The simulator against the emulation: the 4-host 2to1 preset at the emulation's own rates
(20 Mbit/s host links, bytes / 64), `tight` and `forgive`, the same seed and job.

The two cannot agree packet for packet (the emulation's switches and hosts are processes on
a shared machine, scheduled late by milliseconds), so the test holds them to the tolerance
docs/simulation.md states: `tight`'s trim % within 3 percentage points, forgiven % within 2,
forgive trimming more than tight in both, and the same sign for `forgive`'s change in training
time against `tight`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="Mininet needs root"),
    pytest.mark.skipif(shutil.which("mnexec") is None, reason="Debian's mininet is not installed"),
]
FORGIVE = [sys.executable, "-m", "commands.forgive"]
JOB = ["compare", "--fabric", "2to1", "--policies", "tight,forgive", "--seeds", "1"]
JOB += ["--steps", "6", "--timeout", "300"]
EMULATION_RATES = ["--host-link-mbps", "20", "--byte-scale", "64"]
TRIM_POINTS, FORGIVEN_POINTS = 3.0, 2.0


def metrics(out) -> dict[str, dict]:
    return {r["policy"]: r["metrics"] for r in json.loads((out / "runs.json").read_text())}


def compare(args: list[str], out) -> dict[str, dict]:
    proc = subprocess.run(
        [*FORGIVE, *JOB, *args, "--out", str(out)], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return metrics(out)


def test_the_simulator_and_the_emulation_agree_on_trims_forgiveness_and_the_saving(tmp_path):
    emulated = compare([], tmp_path / "emulation")
    simulated = compare(["--engine", "sim", *EMULATION_RATES], tmp_path / "simulation")
    for policy in ("tight", "forgive"):
        emu, sim = emulated[policy], simulated[policy]
        assert abs(sim["forgiven_pct"] - emu["forgiven_pct"]) <= FORGIVEN_POINTS, policy
    tight_trims = [run["tight"]["trim_rate_pct"] for run in (emulated, simulated)]
    assert abs(tight_trims[0] - tight_trims[1]) <= TRIM_POINTS, tight_trims
    # forgive's trims: since the pacing fix (2fe40bf) the simulator's fell from 5.2 to 3.1 %
    # while the emulation's stayed at 6.4 to 7.9 %, outside 3 points (docs/simulation.md,
    # "Agreement with the emulation"); both engines must still show the exemption trimming more
    for run in (emulated, simulated):
        assert run["forgive"]["trim_rate_pct"] > run["tight"]["trim_rate_pct"], run
    saving = {
        name: run["forgive"]["training_time_s"] - run["tight"]["training_time_s"]
        for name, run in (("emulation", emulated), ("simulation", simulated))
    }
    assert (saving["emulation"] < 0) == (saving["simulation"] < 0), saving
