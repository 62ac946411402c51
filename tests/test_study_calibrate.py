"""`forgive study calibrate` on the simulator at a coarse scale (4 hosts, bytes / 128, 5 steps):
the three baseline runs made once, each row computed from their records, the cache reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commands.forgive import main
from runplan.fabric import preset, sim_scaling
from runplan.run import JOBS, RunConfig
from runs.results import RunResult
from study import calibrate
from study.slack import allreduce_bound_s

ARGS = ["study", "calibrate", "--fabric", "2to1", "--job", "default", "--steps", "5",
        "--seeds", "1", "--byte-scale", "128"]  # fmt: skip


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    root = tmp_path_factory.mktemp("calibrate")
    args = [*ARGS, "--cache", str(root / "cache"), "--out", str(root / "out")]
    assert main(args) == 0
    return root, args


def test_every_row_is_computed_from_the_run_records(calibrated, capsys):
    root, _ = calibrated
    doc = json.loads((root / "out" / "study.json").read_text())
    claims = {c["key"]: c for c in doc["claims"]}
    assert set(claims) == {c.key for c in calibrate.claims(_tight_config())}
    runs = {
        name: RunResult.from_json(json.loads((Path(folder) / "result.json").read_text()))
        for name, (folder,) in doc["runs"].items()
    }
    off, on, tight = runs["cc-off"], runs["dcqcn"], runs["tight"]
    assert off.rate_cuts == 0 and off.cnps > 0  # congestion control off: signals, no cuts
    assert on.rate_cuts > 0 and 0 <= on.mark_cuts <= on.rate_cuts
    m_off, m_on = off.metrics(), on.metrics()
    assert claims["cc.retx"]["values"]["1"] == pytest.approx(m_off["retransmitted_pct"])
    assert claims["cc.trim"]["values"]["1"] == pytest.approx(
        m_off["trim_rate_pct"] / m_on["trim_rate_pct"]
    )
    assert claims["cc.time"]["values"]["1"] == pytest.approx(
        100 * (on.training_time_s / off.training_time_s - 1)
    )
    assert claims["cuts.run"]["values"]["1"] == pytest.approx(on.rate_cuts * 20 / 5)  # 5 steps
    assert claims["cuts.marks"]["values"]["1"] == pytest.approx(100 * on.mark_cuts / on.rate_cuts)
    ms = tight.metrics()["allreduce_noncritical_ms"] / tight.time_scale
    bound_ms = 1e3 * allreduce_bound_s(_tight_config())
    assert claims["slack.ms"]["values"]["1"] == pytest.approx(ms)
    assert claims["slack"]["values"]["1"] == pytest.approx(ms / bound_ms, rel=1e-2)
    table = (root / "out" / "table.txt").read_text()
    assert "calibration rows held (direction and x2):" in table
    assert doc["calibration_rows_held"] in range(5)


def test_a_second_calibration_takes_every_run_from_the_cache(calibrated, capsys):
    _, args = calibrated
    capsys.readouterr()
    assert main(args) == 0
    assert "s for 0 runs (3 more from the cache)" in capsys.readouterr().err


def test_bad_options_are_one_line_before_anything_runs(tmp_path, capsys):
    assert main([*ARGS, "--workers", "0", "--cache", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "forgive study: --workers must be >= 1, got 0"
    assert main([*ARGS, "--dcqcn", "ns3", "--cache", str(tmp_path)]) == 2
    assert "--dcqcn must be one of paper, nic, off" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def _tight_config() -> RunConfig:
    """The tight run's configuration, for its line-rate bound."""
    fabric = sim_scaling(preset("2to1"), byte_scale=128)
    return RunConfig(fabric, policy="tight", workload=JOBS["default"], engine="sim")


def test_variants_narrow_the_calibration_and_rows_without_runs_read_as_unmeasured(
    calibrated, capsys
):
    root, _ = calibrated
    args = [*ARGS, "--variants", "cc-off,dcqcn", "--cache", str(root / "cache"),
            "--out", str(root / "two")]  # fmt: skip
    assert main(args) == 0
    assert "3 runs" not in capsys.readouterr().err  # two, both from the cache
    doc = json.loads((root / "two" / "study.json").read_text())
    claims = {c["key"]: c for c in doc["claims"]}
    assert claims["slack"]["values"] == {} and claims["cc.retx"]["values"]["1"] is not None
