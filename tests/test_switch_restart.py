"""A switch that restarts during a run: killed after the first step, started again by the run
(`--switch-restarts`), configured again by the controller, which sees its stream end; the
run carries on, its flows recover by retransmission, and the outage is in its record."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fabric_harness import FORGIVE, MININET

pytestmark = MININET
MARKERS = {
    "model": ("commands.switch --name leaf1 ",),
    "bmv2": ("simple_switch_grpc ", " 1@leaf1-eth1 "),
}
"""What the command line of the switch process to kill holds: leaf1's, whose hosts' flows
then stall (a bare `simple_switch_grpc` matched whichever BMv2 switch ps listed first)."""


def _pid_of(marker: tuple[str, ...]) -> int:
    ps = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True)
    pids = [
        int(line.split()[0])
        for line in ps.stdout.splitlines()
        if all(part in f"{line} " for part in marker)
    ]
    assert len(pids) == 1, f"{len(pids)} processes {marker!r}"
    return pids[0]


def _run_and_kill(switch: str, out: Path) -> tuple[int, str]:
    """`forgive run` with one restart allowed, leaf1 killed once step 1 is recorded."""
    proc = subprocess.Popen(
        [*FORGIVE, "run", "--switch", switch, "--steps", "4", "--grad-mib", "16",
         "--switch-restarts", "1", "--timeout", "300", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        train = out / "forgive-seed1" / "h1.train.jsonl"
        deadline = time.monotonic() + 240  # the fabric lock may make it wait for another run
        while not (train.exists() and "train_step" in train.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        os.kill(_pid_of(MARKERS[switch]), signal.SIGKILL)
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize("switch", ["model", "bmv2"])
def test_a_switch_killed_mid_run_is_started_again_and_the_run_carries_on(switch, tmp_path):
    if switch == "bmv2" and shutil.which("simple_switch_grpc") is None:
        pytest.skip("bmv2: simple_switch_grpc not installed")
    out = tmp_path / "results"
    code, err = _run_and_kill(switch, out)
    assert code == 0, err
    assert "Traceback" not in err
    restarted = [line for line in err.splitlines() if "started again" in line]
    assert len(restarted) == 1 and restarted[0].startswith(
        "forgive: switch leaf1 exited with signal SIGKILL; started again and configured ("
    ), err
    (run,) = json.loads((out / "runs.json").read_text())
    (outage,) = run["switch_restarts"]
    assert outage["switch"] == "leaf1" and outage["exit"] == "signal SIGKILL"
    assert outage["entries"] > 0  # every entry written again: the new process held none
    assert 0 < outage["lost_s"] < 60
    assert len(run["steps"]) == 4 and run["metrics"]["bound_held"]
    assert run["retransmitted_bytes"] > 0  # what the outage cost the flows through leaf1
    if switch == "model":  # the pipeline pushed to the first process and to the second
        log = Path(out / "forgive-seed1" / "logs" / "leaf1.model.log").read_text()
        assert log.count("pipeline committed") == 2
