"""`forgive study regime`: a two-cell grid at a coarse byte scale, checked against its own runs,
and the cells' arithmetic on the note's fabric worked out by hand."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from commands import study as study_cli
from commands.forgive import main
from runplan.fabric import FabricError
from runplan.run import JOBS, RunConfig, RunError
from runs.cache import run_key
from runs.options import REGIME_PROFILES, fabric_from
from study import regime
from study.variants import BY_NAME, TIGHT

GRID = ["study", "regime", "--fabric", "2to1", "--job", "default", "--steps", "5"]
GRID += ["--byte-scale", "128", "--seeds", "1", "--cells", "base,step/buffer=4"]


def test_a_ring_step_on_the_notes_fabric_is_its_4_mib_queue():
    base = RunConfig(fabric_from("note-4to1", "sim", None, 16), workload=JOBS["note"])
    # 64 MiB / 64 ranks = 1 MiB chunks, 8 hosts of a leaf crossing 2 spines: 4 MiB per uplink
    assert regime.ring_step_bytes(base) == 4 << 20
    eight = regime.with_step_over_buffer(base, 8.0).fabric.switch
    assert eight.data_queue_bytes == 512 << 10
    assert (eight.ecn_kmin_bytes, eight.ecn_kmax_bytes) == (100_000, 400_000)


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ("buffer=2", "is not base or AXIS=VALUE"),
        ("step/buffer=x", "the value must be a number"),
        ("step/buffer=0", "the value must lie in (0, 1000)"),
        ("jitter=-1", "the value must lie in (0, 1000)"),
        ("dcqcn=fast", "dcqcn is one of paper, nic"),
        ("fabric=moon", "fabric is one of"),
        ("window=huge", "window is one of none, bdp"),
        ("tp=later", "tp is one of own, overlap"),
        ("without=pfc", "without is one of splits, completion"),
        (",", "--cells is empty"),
    ],
)
def test_bad_cells_are_refused_in_one_line(cells, message):
    with pytest.raises(RunError, match=message.replace("(", r"\(").replace(")", r"\)")):
        regime.parse_cells(cells)


def test_a_two_cell_grid_reports_what_its_runs_measured(tmp_path, capsys):
    pandas = pytest.importorskip("pandas")
    out = tmp_path / "out"
    assert main([*GRID, "--cache", str(tmp_path / "cache"), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "base" in table and "step/buffer=4" in table and "saving = " in table
    doc = json.loads((out / "regime.json").read_text())
    runs = pandas.read_csv(out / "runs.csv").set_index("variant")
    for cell in doc["cells"]:
        tight = runs.loc[f"{cell['cell']}/tight"]
        forgive = runs.loc[f"{cell['cell']}/forgive"]
        change = 100 * (forgive.training_time_run_ms / tight.training_time_run_ms - 1)
        assert cell["change_pct"]["1"] == pytest.approx(change)
        assert cell["given_up_pct"]["1"] == pytest.approx(forgive.forgiven_pct)
        assert cell["trim_tight_pct"]["1"] == pytest.approx(tight.trim_rate_pct)
        fabric_ms = tight.allreduce_noncritical_fabric_ms
        assert cell["slack"]["1"] == pytest.approx(fabric_ms / cell["allreduce_bound_ms"])
    base, quarter = doc["cells"]
    assert base["ring_step_over_buffer"] == pytest.approx(8.0)  # 2to1: 16 MiB chunks, 2 per uplink
    assert quarter["ring_step_over_buffer"] == pytest.approx(4.0)
    assert doc["fit"] is not None and doc["note"]["saving_pct"] == [16.1, 16.7]
    for name in ("change_vs_slack.png", "given_up_vs_change.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert "data:image/png;base64," in (out / "report.html").read_text()
    # a second grid takes every run from the cache
    assert main([*GRID, "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err.count("cached in") == 4


def test_the_default_grid_leaves_out_what_the_byte_scale_cannot_hold():
    # at bytes / 32 a ring step of 8 data queues leaves 512 KiB / 32 = 16 KiB, under 4 frames
    base = RunConfig(fabric_from("note-4to1", "sim", None, 32), workload=JOBS["note"])
    kept, left_out = regime.feasible(regime.DEFAULT_GRID, base)
    assert [c.name for c in regime.DEFAULT_GRID if c not in kept] == ["step/buffer=8"]
    assert "under 4 full frames (4 x 4154 = 16616 B)" in left_out[0]
    with pytest.raises(FabricError, match="cell step/buffer=8: data_queue_bytes"):
        regime.plan(regime.parse_cells("base,step/buffer=8"), base, [1])


def test_the_jitter_cell_makes_the_simulators_hosts_late_and_nothing_else():
    base = RunConfig(fabric_from("note-4to1", "sim", None, 32), workload=JOBS["note"])
    (cell,) = regime.parse_cells("jitter=1")
    late = cell.config(base, "tight", 1)
    assert cell.name == "jitter=1" and late.jitter_frames == 1.0 and base.jitter_frames == 0
    assert replace(late, jitter_frames=0.0) == replace(base, policy="tight", seed=1)


def test_the_astra_profile_cell_sets_its_dcqcn_and_nic_options():
    base = RunConfig(fabric_from("note-4to1", "sim", None, 32), workload=JOBS["note"])
    astra = regime.Cell("profile", "astra").config(base, "tight", 1)
    assert astra.dcqcn == "nic" and astra.fabric.nic.window == "bdp"
    assert astra.fabric.nic.dcqcn_state == "message" and base.fabric.nic.window == "none"


def test_the_astra_buffer_profile_cell_also_resizes_the_data_queue():
    base = RunConfig(fabric_from("note-4to1", "sim", None, 32), workload=JOBS["note"])
    cell = regime.Cell("profile", "astra-buffer").config(base, "tight", 1)
    assert cell.dcqcn == "nic" and cell.fabric.nic.window == "bdp"
    assert cell.fabric.switch.data_queue_bytes == 8 << 20
    assert base.fabric.switch.data_queue_bytes == 4 << 20


def _study_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    study_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["study", *argv])


@pytest.mark.parametrize("profile", list(REGIME_PROFILES))
@pytest.mark.parametrize(
    ("schedule", "regime_schedule"),
    [
        (["--steps", "20"], ["--steps", "20", "--critical-steps", "1,2,3,20"]),
        (["--steps", "5"], ["--steps", "5", "--critical-steps", "1,2,3,5"]),
        (["--steps", "5", "--critical-steps", "1"], []),  # the grid's default run
    ],
)
def test_a_profile_cell_is_the_run_study_note_makes_with_that_profile(
    profile, schedule, regime_schedule
):
    note = _study_args("note", "--profile", profile, "--byte-scale", "32", *schedule)
    setup, _ = study_cli.setup_from(note)
    noted = setup.config(BY_NAME[TIGHT], 1)
    grid = _study_args("regime", "--cells", f"profile={profile}", *regime_schedule)
    base, (cell,), _, _, _ = study_cli._regime_setup(grid)
    celled = cell.config(base, TIGHT, 1)
    assert celled == noted and run_key(celled) == run_key(noted)
    assert celled.fabric != base.fabric and celled.dcqcn == "nic" != base.dcqcn


def test_a_profile_base_point_is_the_run_study_note_makes_with_that_profile():
    note = _study_args(*note_argv("astra-ns3"), "--critical-steps", "1")
    noted = study_cli.setup_from(note)[0].config(BY_NAME[TIGHT], 1)
    grid = _study_args("regime", "--profile", "astra-ns3", "--byte-scale", "128", "--cells", "base")
    base, (cell,), _, _, _ = study_cli._regime_setup(grid)
    celled = cell.config(base, TIGHT, 1)
    assert note.profile == "astra-ns3"
    assert celled == noted and run_key(celled) == run_key(noted)


def note_argv(profile: str) -> list[str]:
    return ["note", "--profile", profile, "--byte-scale", "128", "--steps", "5"]


def _settings(config: RunConfig) -> dict[str, object]:
    """Every setting a `without` cell may touch, by the mechanism's name."""
    nic, job = config.fabric.nic, config.workload
    return {
        "splits": (job.splits, job.active_splits),
        "completion": job.completion,
        "local-mem": job.reduce_bytes_per_s,
        "control": config.fabric.switch.control,
        "ack-every": nic.ack_every,
        "paths": nic.paths,
        "cnp": nic.cnp,
        "payload": nic.payload_bytes,
        "window": nic.window,
        "dcqcn": config.dcqcn,
    }


@pytest.mark.parametrize("mechanism", list(regime.MECHANISMS))
def test_a_without_cell_sets_one_mechanism_back_to_the_projects_default(mechanism):
    plain = RunConfig(fabric_from("note-4to1", "sim", None, 128), workload=JOBS["note"])
    grid = _study_args("regime", "--profile", "astra-ns3", "--byte-scale", "128", "--cells",
                       f"base,without={mechanism}")  # fmt: skip
    base, (b, cell), _, _, _ = study_cli._regime_setup(grid)
    before, after = _settings(b.config(base, TIGHT, 1)), _settings(cell.config(base, TIGHT, 1))
    ours = _settings(plain)
    assert cell.name == f"without={mechanism}"
    assert before[mechanism] != ours[mechanism]
    assert after[mechanism] == ours[mechanism]
    assert {k: v for k, v in after.items() if k != mechanism} == {
        k: v for k, v in before.items() if k != mechanism
    }


def test_a_bad_regime_profile_is_refused_in_one_line():
    with pytest.raises(RunError, match="--profile must be one of astra, astra-buffer, astra-ns3"):
        study_cli._regime_setup(_study_args("regime", "--profile", "ns3"))
