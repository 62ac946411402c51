"""The run cache: keyed by what decides a run, resumable, and never repeating a run it has."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from runplan.fabric import preset
from runplan.run import RunConfig, RunError, Workload
from runs import cache
from runs.cache import RESULT, RunCache, config_doc, link_runs, run_cached, run_key
from runs.results import RunResult, StepResult

BASE = RunConfig(preset("2to1"), policy="forgive", seed=1)


def fake_run(config: RunConfig, folder: Path, label: str, tty: bool | None = None) -> RunResult:
    """Stands in for an engine: leaves a record in the folder, counts itself, fails on demand."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "h1.train.jsonl").write_text("{}\n")
    calls = folder.parent / "calls"
    with calls.open("a") as f:
        f.write(f"{config.policy}:{config.seed}\n")
    if config.policy == "loose":
        raise RuntimeError("this run breaks")
    return RunResult(
        policy=config.policy, seed=config.seed, fabric=config.fabric.name, time_scale=1.0,
        training_time_s=float(config.seed), steps=[StepResult(1, True, 1.0, [0.5], 10, 0, 0, True)],
        data_bytes_sent=1, retransmitted_bytes=0, data_packets_sent=1, trims=0, ce_marks=0,
        cnps=0, rtos=0, exemption_toggles=[], tp_completion_s=[], bound_violations=0,
    )  # fmt: skip


def calls(root: Path) -> list[str]:
    path = root / "calls"
    return path.read_text().split() if path.exists() else []


def test_the_key_follows_what_decides_a_run_and_nothing_else():
    assert run_key(BASE) == run_key(replace(BASE, timeout_s=5.0))
    others = [
        replace(BASE, seed=2),
        replace(BASE, policy="tight"),
        replace(BASE, engine="sim"),
        replace(BASE, dcqcn="nic"),
        replace(BASE, companion="dcqcn"),
        replace(BASE, workload=Workload(steps=3)),
        replace(BASE, fabric=preset("4to1")),
        replace(BASE, engine="sim", jitter_frames=1.0),
    ]
    keys = {run_key(c) for c in others}
    assert len(keys) == len(others) and run_key(BASE) not in keys
    # runs in exact timing keep the keys they had before the jitter option existed
    assert "jitter_frames" not in config_doc(replace(BASE, engine="sim"))


def test_a_change_to_nscc_alone_moves_only_nscc_runs_keys(monkeypatch):
    nscc = replace(BASE, engine="sim", cc="nscc")
    dcqcn = replace(BASE, engine="sim")
    before = run_key(nscc), run_key(dcqcn)
    monkeypatch.setattr(cache, "NSCC_VERSION", cache.NSCC_VERSION + 1)
    assert run_key(nscc) != before[0] and run_key(dcqcn) == before[1]
    monkeypatch.setattr(cache, "CACHE_VERSION", cache.CACHE_VERSION + 1)
    assert run_key(dcqcn) != before[1]


def test_jitter_is_refused_outside_the_simulator_and_below_zero():
    with pytest.raises(RunError, match="--jitter needs --engine sim"):
        replace(BASE, jitter_frames=1.0).validate()
    with pytest.raises(RunError, match="--jitter must be a finite number >= 0"):
        replace(BASE, engine="sim", jitter_frames=-0.5).validate()


def test_runs_once_then_from_the_cache_and_fresh_on_demand(tmp_path):
    cache = RunCache(tmp_path)
    configs = [BASE, replace(BASE, seed=2)]
    first = run_cached(configs, cache, fake_run)
    assert [r.seed for r in first] == [1, 2] and calls(tmp_path) == ["forgive:1", "forgive:2"]
    lines = []
    again = run_cached(configs, cache, fake_run, say=lines.append)
    assert [r.to_json() for r in again] == [r.to_json() for r in first]
    assert calls(tmp_path) == ["forgive:1", "forgive:2"] and len(lines) == 2
    assert "cached" in lines[0]
    run_cached(configs[:1], cache, fake_run, fresh=True)
    assert calls(tmp_path)[-1] == "forgive:1" and len(calls(tmp_path)) == 3


def test_an_interrupted_sequence_resumes_with_the_runs_it_lacks(tmp_path):
    cache = RunCache(tmp_path)
    configs = [BASE, replace(BASE, policy="loose"), replace(BASE, seed=3)]
    with pytest.raises(RuntimeError, match="breaks"):
        run_cached(configs, cache, fake_run)
    assert cache.get(BASE) is not None and cache.get(configs[1]) is None
    assert not (cache.folder(configs[1]) / RESULT).exists()  # records, but no result: unfinished
    configs[1] = replace(BASE, policy="tight")
    run_cached(configs, cache, fake_run)
    assert calls(tmp_path) == ["forgive:1", "loose:1", "tight:1", "forgive:3"]


def test_workers_store_each_run_and_keep_the_order(tmp_path):
    cache = RunCache(tmp_path)
    configs = [replace(BASE, seed=s) for s in (3, 1, 2)]
    results = run_cached(configs, cache, fake_run, workers=2)
    assert [r.seed for r in results] == [3, 1, 2]
    assert sorted(calls(tmp_path)) == ["forgive:1", "forgive:2", "forgive:3"]
    assert all(cache.get(c) is not None for c in configs)


def test_a_results_folder_links_to_the_cached_runs(tmp_path):
    cache = RunCache(tmp_path / "cache")
    run_cached([BASE], cache, fake_run)
    link_runs(tmp_path / "out", [BASE], cache)
    assert (tmp_path / "out" / "forgive-seed1" / "h1.train.jsonl").exists()
    link_runs(tmp_path / "out", [BASE], cache)  # again: the link is replaced, not an error
    assert (tmp_path / "out" / "forgive-seed1").is_symlink()


def test_a_folder_whose_configuration_differs_is_not_taken(tmp_path):
    cache = RunCache(tmp_path)
    run_cached([BASE], cache, fake_run)
    (cache.folder(BASE) / "config.json").write_text('{"edited": true}')
    assert cache.get(BASE) is None


def test_compare_with_a_cache_runs_once_and_links_the_runs(tmp_path, capsys):
    from commands.forgive import main

    args = ["compare", "--engine", "sim", "--fabric", "2to1", "--steps", "2", "--byte-scale", "64"]
    args += ["--policies", "tight,forgive", "--seeds", "1", "--cache", str(tmp_path / "cache")]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert err.count("cached in") == 2, "the second comparison runs nothing"
    assert (tmp_path / "a" / "runs.json").read_bytes() == (
        tmp_path / "b" / "runs.json"
    ).read_bytes()
    link = tmp_path / "b" / "forgive-seed1"
    assert link.is_symlink() and len(list(link.glob("h*.train.jsonl"))) == 4


def test_a_dask_cluster_fills_the_cache_and_a_second_study_reads_it(tmp_path, capsys):
    from distributed import LocalCluster

    from commands.forgive import main

    args = ["compare", "--engine", "sim", "--fabric", "2to1", "--steps", "2", "--byte-scale", "64"]
    args += ["--policies", "tight,forgive", "--seeds", "1", "--cache", str(tmp_path / "cache")]
    assert main([*args, "--out", str(tmp_path / "seq"), "--fresh"]) == 0
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster:
        dask = ["--dask", cluster.scheduler_address]
        assert main([*args, *dask, "--fresh", "--out", str(tmp_path / "dask")]) == 0
    assert capsys.readouterr().err.count("done on the cluster") == 2
    assert (tmp_path / "dask" / "runs.json").read_bytes() == (
        tmp_path / "seq" / "runs.json"
    ).read_bytes()
    assert main([*args, "--out", str(tmp_path / "again")]) == 0
    assert capsys.readouterr().err.count("cached in") == 2
