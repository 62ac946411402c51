"""The simulator against the emulation: the 4-host 2to1 preset at the emulation's own rates
(20 Mbit/s host links, bytes / 64), `forgive`, 6 steps (1-3 and 6 critical, 4 and 5 not).

One emulated run (seed 1) is held against the simulator's median over seeds 1-3, run with one
frame time of jitter (`--jitter 1`): in exact timing equally paced senders keep one phase and
one of them takes most of a full queue's trims, which no emulated run does
(docs/simulation.md, "Agreement with the emulation"; tests/test_sim_analytic.py holds the
phase itself). The tolerances come from the emulation's own spread, measured over repeated
runs of this job on 2026-12-02 (the same section):

- forgiven %: within a factor of FORGIVEN_FACTOR. Thirteen emulated runs gave 0.95 to 2.92
  percent (geometric mean 1.71, standard deviation of the logarithm 0.40); the bottom of their
  three-standard-deviation band, 0.51, is 5.3 times below the simulator's median (2.68).
- the gradient bytes trimmed in the critical steps, where the budget is `tight`'s: within
  CRITICAL_TRIM_POINTS (thirteen emulated runs, two of them `tight`, 0.90 to 3.0 percent, the
  simulator's seeds 0.9 to 2.0: the two ranges add to 3.2 points, and the farthest emulated
  run is 1.6 from the simulator's median).
- in each engine, the non-critical steps trim a larger share of their gradient bytes than the
  critical ones, and forgive a larger share: their larger budget at work (it does not tell
  `forgive` from `forgive-no-exemption`, which simulated trims 3.8 against 1.0 percent; plain
  `dcqcn` fails it).

With that spread one emulated run cannot tell the exact simulator (median 0.72) from the
jittered one. `forgive`'s trim % is not held: the emulation runs in a quiet or a busy regime,
and the jittered simulator's is 1.05 to 3.7 times its. Nor is the sign of the saving against
`tight`, which one seed of the simulator does not keep (+1.9 to -17.6 percent over seeds 1-5).
"""

from __future__ import annotations

import json
import statistics
import subprocess

from fabric_harness import FORGIVE, MININET

pytestmark = MININET
JOB = ["--fabric", "2to1", "--steps", "6", "--timeout", "300"]
SIMULATION = ["compare", "--engine", "sim", "--policies", "forgive", "--seeds", "1,2,3"]
SIMULATION += ["--host-link-mbps", "20", "--byte-scale", "64", "--jitter", "1", "--workers", "2"]
EMULATION = ["run", "--policy", "forgive", "--seed", "1"]
FORGIVEN_FACTOR = 6.0
CRITICAL_TRIM_POINTS = 3.0


def start(args: list[str], out) -> subprocess.Popen:
    return subprocess.Popen(
        [*FORGIVE, *args, *JOB, "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def runs(proc: subprocess.Popen, out) -> list[dict]:
    try:
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    return json.loads((out / "runs.json").read_text())


def _steps(run: dict, critical: bool) -> list[dict]:
    return [s for s in run["steps"] if s["critical"] == critical]


def trimmed_pct(run: dict, critical: bool) -> float:
    """Gradient bytes trimmed over the critical (or the other) steps, in % of those expected."""
    steps = _steps(run, critical)
    trimmed = sum(fifth[1] for s in steps for fifth in s["trim_fifths"])
    return 100 * trimmed / sum(s["expected_bytes"] for s in steps)


def forgiven_pct(run: dict, critical: bool) -> float:
    """Gradient bytes forgiven over the critical (or the other) steps, in % of those expected."""
    steps = _steps(run, critical)
    return 100 * sum(s["forgiven_bytes"] for s in steps) / sum(s["expected_bytes"] for s in steps)


def test_the_simulator_and_the_emulation_agree_on_forgiveness_and_critical_trims(tmp_path):
    # the simulator runs while the emulation does: it needs no fabric, only the CPU
    simulation = start(SIMULATION, tmp_path / "simulation")
    (emulated,) = runs(start(EMULATION, tmp_path / "emulation"), tmp_path / "emulation")
    simulated = runs(simulation, tmp_path / "simulation")
    assert len(simulated) == 3
    for run in (emulated, *simulated):
        assert run["metrics"]["bound_held"], run["seed"]
        assert trimmed_pct(run, critical=False) > trimmed_pct(run, critical=True), run["seed"]
        assert forgiven_pct(run, critical=False) > forgiven_pct(run, critical=True), run["seed"]
    emu = emulated["metrics"]["forgiven_pct"]
    sim = statistics.median(run["metrics"]["forgiven_pct"] for run in simulated)
    assert emu > 0 and sim > 0, (emu, sim)
    assert max(emu / sim, sim / emu) <= FORGIVEN_FACTOR, (emu, sim)
    critical = statistics.median(trimmed_pct(run, critical=True) for run in simulated)
    assert abs(trimmed_pct(emulated, critical=True) - critical) <= CRITICAL_TRIM_POINTS
