import json

import pytest

from runs.report import read_runs, write_results
from runs.results import RunResult, StepResult, compare, format_table


def run(policy, seed, train_s, forgiven=0, violations=0, crit_ms=(10.0,), norm_ms=(20.0, 30.0)):
    steps = [
        StepResult(1, True, 1.0, [t / 1e3 for t in crit_ms], 1000, 0, 5, True),
        StepResult(2, False, train_s - 1.0, [t / 1e3 for t in norm_ms], 1000, forgiven, 100, True),
    ]
    return RunResult(
        policy=policy, seed=seed, fabric="2to1", time_scale=100.0, training_time_s=train_s, steps=steps,
        data_bytes_sent=4000, retransmitted_bytes=400, data_packets_sent=200, trims=10, ce_marks=7,
        cnps=3, rtos=1, exemption_toggles=[1, 2], tp_completion_s=[0.004, 0.006], bound_violations=violations,
        timeline=[{"t": 0.0, "trims": 0}, {"t": 1.0, "trims": 10}],
    )  # fmt: skip


def test_metrics_in_the_notes_terms():
    m = run("forgive", 1, 2.0, forgiven=50).metrics()
    assert m["fabric_training_time_ms"] == pytest.approx(20.0)
    assert m["allreduce_critical_ms"] == pytest.approx(10.0)
    assert m["allreduce_noncritical_ms"] == pytest.approx(25.0)
    assert m["forgiven_pct"] == pytest.approx(2.5)
    assert m["retransmitted_pct"] == pytest.approx(10.0)
    assert m["trim_rate_pct"] == pytest.approx(5.0)
    assert m["toggles_per_exempt_flow"] == pytest.approx(1.5)
    assert m["tp_completion_ms"] == pytest.approx(5.0)
    assert m["bound_held"] is True
    assert run("forgive", 1, 2.0, violations=1).metrics()["bound_held"] is False


def test_compare_takes_the_change_against_tight_per_seed():
    runs = [
        run("tight", 1, 10.0),
        run("tight", 2, 20.0),
        run("forgive", 1, 8.0),
        run("forgive", 2, 17.0),
    ]
    summary = compare(runs)
    assert summary["forgive"]["time_vs_tight_pct"] == pytest.approx([-20.0, -15.0])
    assert summary["tight"]["time_vs_tight_pct"] == [0.0, 0.0]
    table = format_table(summary, order=["tight", "forgive"])
    lines = table.splitlines()
    assert (
        lines[0].startswith("policy")
        and lines[2].startswith("tight")
        and lines[3].startswith("forgive")
    )
    assert "-20.0..-15.0" in lines[3] and "8.00..17.00" in lines[3] and "yes" in lines[3]


def test_results_folder_round_trip_and_plots(tmp_path):
    runs = [run("tight", 1, 10.0), run("forgive", 1, 8.0, forgiven=40, violations=1)]
    table = write_results(tmp_path, runs, order=["tight", "forgive"])
    assert "no (1)" in table.splitlines()[3]
    assert json.loads((tmp_path / "summary.json").read_text())["forgive"]["seeds"] == [1]
    assert [r.to_json() for r in read_runs(tmp_path)] == [r.to_json() for r in runs]
    for name in ("step_times.png", "forgiven_vs_budget.png", "trims_over_time.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
