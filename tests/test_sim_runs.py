"""`forgive run/compare --engine sim`: the emulation's outputs from virtual time, the same bytes
for the same seed, and the same results whether runs go one by one, to worker processes or
to a Dask cluster."""

from __future__ import annotations

import itertools
import json

import pytest

from commands.forgive import main

SMALL = ["--engine", "sim", "--fabric", "2to1", "--steps", "3"]
SMALL += ["--byte-scale", "64"]
COMPARE = ["compare", *SMALL, "--policies", "tight,forgive", "--seeds", "1,2"]


def runs(folder):
    return (folder / "runs.json").read_bytes()


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    out = tmp_path_factory.mktemp("sequential")
    assert main([*COMPARE, "--out", str(out)]) == 0
    return out


def test_a_simulated_run_writes_what_an_emulated_one_does_and_adds_up(sequential, capsys):
    doc = json.loads(runs(sequential))
    assert [(r["policy"], r["seed"]) for r in doc] == [
        ("tight", 1),
        ("tight", 2),
        ("forgive", 1),
        ("forgive", 2),
    ]
    for run in doc:
        assert [s["step"] for s in run["steps"]] == [1, 2, 3]
        assert run["metrics"]["bound_held"] and run["bound_violations"] == 0
        acc = run["accounting"]
        assert acc["flows_sent"] == acc["flows_received"] > 0
        assert acc["flow_bytes_sent"] == acc["flow_bytes_received"] + acc["flow_bytes_forgiven"]
        assert (
            acc["trims_at_switches"] - acc["drops_at_switches"]
            <= acc["trims_seen_by_receivers"]
            <= acc["trims_at_switches"]
        )
        assert run["trims"] > 0 and run["ce_marks"] > 0
        assert run["timeline"] and run["timeline"][-1]["trims"] <= run["trims"]
        assert set(run["switch_counters"]) == {"leaf1", "leaf2", "spine1"}
    assert any(r["accounting"]["flow_bytes_forgiven"] for r in doc if r["policy"] == "forgive")
    for name in ("step_times.png", "forgiven_vs_budget.png", "trims_over_time.png", "table.txt"):
        assert (sequential / name).stat().st_size > 0
    assert len(list((sequential / "forgive-seed1").glob("h*.train.jsonl"))) == 4
    assert len(list((sequential / "forgive-seed1").glob("h*.agent.jsonl"))) == 4


def test_the_same_seed_gives_a_byte_identical_runs_json(sequential, tmp_path):
    assert main([*COMPARE, "--out", str(tmp_path)]) == 0
    assert runs(tmp_path) == runs(sequential)


def test_worker_processes_give_the_sequential_results(sequential, tmp_path):
    assert main([*COMPARE, "--workers", "2", "--out", str(tmp_path)]) == 0
    assert runs(tmp_path) == runs(sequential)


def test_a_dask_cluster_gives_the_sequential_results(sequential, tmp_path):
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster:
        assert main([*COMPARE, "--dask", cluster.scheduler_address, "--out", str(tmp_path)]) == 0
    assert runs(tmp_path) == runs(sequential)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engine", "warp"], "--engine must be one of mininet, sim"),
        (["--engine", "sim", "--switch", "bmv2"], "--engine sim runs the switch model"),
        (["--job", "huge"], "--job must be one of default, note"),
        (["--workers", "2"], "--workers and --dask need --engine sim"),
        (["--engine", "sim", "--workers", "0"], "--workers must be >= 1"),
        (["--engine", "sim", "--tp-group", "1"], "tp_group must lie in 2.."),
    ],
)
def test_bad_engine_options_are_one_line_and_status_2(args, message, capsys):
    assert main(["compare", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_the_trims_timeline_stays_bounded_however_long_a_run_lasts():
    """A run that hangs until its timeout samples the switches' counters all the while: the
    timeline thins itself (every other sample, twice the interval) past MAX_SAMPLES, so its
    memory is bounded (a hung 64-rank run had grown to 11 GB) and its spacing stays even."""
    from simulator.run import MAX_SAMPLES, bounded

    timeline: list[float] = []
    every, t = 1.0, 0.0
    for _ in range(20 * MAX_SAMPLES):
        timeline.append(t)
        every = bounded(timeline, every)
        t += every
        assert len(timeline) <= MAX_SAMPLES
    gaps = {b - a for a, b in itertools.pairwise(timeline)}
    # the first sample, the newest, and an even spacing between, however often it thinned
    assert timeline[0] == 0.0 and timeline[-1] == t - every and gaps == {every} and every > 1
