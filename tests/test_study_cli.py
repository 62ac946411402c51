"""`forgive study note` end to end with a stand-in engine: every variant planned and run once,
the table printed, the cache reused, bad options refused in one line before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commands import study as study_cli
from commands.forgive import main
from runplan.run import RunConfig
from runs.results import RunResult, StepResult
from study.variants import VARIANTS

TIME = {"tight": 100.0, "forgive": 84.0, "dcqcn": 100.5, "forgive-P0": 85.0}


def stand_in(config: RunConfig, folder: Path, label: str, tty: bool | None = None) -> RunResult:
    """A run's result as a function of its configuration, and a line per call in `calls`."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder.parent / "calls").open("a") as f:
        f.write(label + "\n")
    wrong = set(config.workload.misclassify)
    steps = [
        StepResult(
            k, (k in (1, 2, 3, 20)) != (k in wrong), 1.0, [0.01], 1000, 70, 100, True,
            misclassified=k in wrong, trim_fifths=[[70, 60, 10], [0, 0, 0], [0] * 3, [0] * 3, [10, 10, 6]],
        )
        for k in range(1, config.workload.steps + 1)
    ]  # fmt: skip
    result = RunResult(
        policy=config.policy, seed=config.seed, fabric=config.fabric.name, time_scale=1.0,
        training_time_s=TIME.get(config.policy, 97.0) + config.seed, steps=steps,
        data_bytes_sent=1000, retransmitted_bytes=50, data_packets_sent=100, trims=5,
        ce_marks=1, cnps=10, rtos=2, exemption_toggles=[1], tp_completion_s=[0.1],
        bound_violations=0,
    )  # fmt: skip
    if config.companion:
        result.companion = RunResult(**{**result.__dict__, "training_time_s": 50.0}).to_json()
    return result


@pytest.fixture
def stand_in_engine(monkeypatch):
    monkeypatch.setattr(study_cli, "RUNNER", stand_in)


def study(tmp_path, *extra):
    return main(
        ["study", "note", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out"),
         "--seeds", "1,2", *extra]
    )  # fmt: skip


def test_every_variant_runs_once_and_the_table_follows(tmp_path, stand_in_engine, capsys):
    assert study(tmp_path) == 0
    out = capsys.readouterr()
    calls = (tmp_path / "cache" / "calls").read_text().splitlines()
    assert len(calls) == 2 * len(VARIANTS)
    assert "study note: 30 runs (0 in the cache" in out.err
    assert "s for 30 runs (0 more from the cache)" in out.err
    row = next(line for line in out.out.splitlines() if "forgive: training time vs tight" in line)
    assert "-16.7..-16.1" in row and "-15.8..-15.7 (2)" in row  # (84+s)/(100+s) - 1
    doc = json.loads((tmp_path / "out" / "study.json").read_text())
    assert doc["variants"]["dcqcn"] == [1, 2] and doc["seeds"] == [1, 2]
    assert (tmp_path / "out" / "time_vs_baseline.png").exists()
    # again: everything from the cache, nothing run
    assert study(tmp_path) == 0
    assert len((tmp_path / "cache" / "calls").read_text().splitlines()) == len(calls)
    err = capsys.readouterr().err
    assert "(30 in the cache" in err and "s for 0 runs (30 more from the cache)" in err
    doc = json.loads((tmp_path / "out" / "study.json").read_text())
    assert (doc["runs_made"], doc["runs_from_cache"]) == (0, 30)


def test_worker_processes_give_what_one_process_gives(tmp_path, stand_in_engine):
    variants = "tight,forgive,second-job:tight,second-job:forgive"
    assert study(tmp_path / "one", "--variants", variants) == 0
    assert study(tmp_path / "two", "--variants", variants, "--workers", "2") == 0
    docs = [json.loads((tmp_path / d / "out" / "study.json").read_text()) for d in ("one", "two")]
    assert [c["values"] for c in docs[0]["claims"]] == [c["values"] for c in docs[1]["claims"]]
    assert docs[1]["engine"] == "sim" and docs[1]["worst_fabric"] == "note-4to1"


def test_the_detector_and_second_job_rows_come_from_their_variants(tmp_path, stand_in_engine):
    assert study(tmp_path, "--variants", "tight,forgive,detector:critical-missed") == 0
    doc = json.loads((tmp_path / "out" / "study.json").read_text())
    claims = {c["key"]: c for c in doc["claims"]}
    # critical steps 1, 2, 3, 20 taken as non-critical: 70 of 1000 bytes lost on each
    assert claims["detector.missed"]["values"] == {"1": 7.0, "2": 7.0}
    assert claims["second-job.time"]["median"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "warp"], "--engine must be one of"),
        (["--seeds", "1,x"], "bad --seeds '1,x'"),
        (["--variants", "tight,reckless"], "unknown variant 'reckless'"),
        (["--dcqcn", "ns3"], "--dcqcn must be one of paper, nic"),
        (["--cc", "tcp"], "--cc must be one of dcqcn, nscc"),
        (["--fabric", "8to1"], "unknown fabric preset '8to1'"),
        (["--timeout", "nan"], "--timeout must be a finite number"),
        (["--engine", "mininet", "--workers", "2"], "--workers and --dask need --engine sim"),
        (
            ["--engine", "mininet", "--dask", "127.0.0.1:1"],
            "--workers and --dask need --engine sim",
        ),
        (["--job", "huge"], "--job must be one of default, note"),
        (["--byte-scale", "0.5"], "byte_scale must be a finite number >= 1"),
    ],
)
def test_bad_options_are_one_line_and_nothing_runs(
    tmp_path, stand_in_engine, capsys, args, message
):
    assert study(tmp_path, *args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "cache").exists()


def test_the_plan_gives_each_variant_its_fabric_seeds_job_and_detector():
    from runplan.fabric import preset
    from runplan.run import JOBS
    from study.runs import Setup, plan
    from study.variants import BY_NAME, FALSE, MISSED, NB_FORGIVE, wrong_steps

    setup = Setup(
        worst=preset("note-4to1"), nonblocking=preset("note-1to1"), workload=JOBS["note"],
        seeds=(1, 2, 3), baseline_seeds=(1, 2, 3, 4, 5),
    )  # fmt: skip
    planned = plan(setup, VARIANTS)
    assert len(planned) == 2 * 5 + 13 * 3  # tight and dcqcn on five seeds, the rest on three
    assert len({c for _, c in planned}) == len(planned)
    by = {(v.name, c.seed): c for v, c in planned}
    assert (
        by[NB_FORGIVE, 2].fabric.name == "note-1to1" and by["forgive", 2].fabric.name == "note-4to1"
    )
    assert by["second-job:forgive", 1].companion == "dcqcn" and by["forgive", 1].companion is None
    assert by[MISSED, 1].workload.misclassify == (1, 2, 3, 20)
    assert by[FALSE, 1].workload.misclassify == (4, 6, 8, 10, 12, 14, 16, 18)
    assert wrong_steps(None, 20) == () and BY_NAME["dcqcn"].baseline_seeds
    assert all(c.engine == "sim" and c.workload.tp_group == 8 for _, c in planned)


def test_cc_nscc_adds_the_headline_variants_under_nscc_and_their_rows(tmp_path, stand_in_engine):
    assert study(tmp_path, "--variants", "tight", "--cc", "nscc") == 0
    calls = (tmp_path / "cache" / "calls").read_text().splitlines()
    assert len(calls) == 2 * 5  # tight under DCQCN and the four NSCC variants, two seeds
    doc = json.loads((tmp_path / "out" / "study.json").read_text())
    assert set(doc["variants"]) == {
        "tight", "nscc:tight", "nscc:forgive", "nscc:forgive-P0", "nscc:plain"
    }  # fmt: skip
    assert doc["cc"] == ["dcqcn", "nscc"]
    claims = {c["key"]: c for c in doc["claims"]}
    # the stand-in times runs by policy alone, so NSCC's are DCQCN's: (84+s)/(100+s) - 1
    assert claims["nscc.forgive"]["values"] == pytest.approx(
        {"1": 100 * (85 / 101 - 1), "2": 100 * (86 / 102 - 1)}
    )
    assert claims["nscc.vs.dcqcn"]["values"] == {"1": 0.0, "2": 0.0}
    # and a study without --cc has neither the variants nor the rows
    assert study(tmp_path / "plain", "--variants", "tight") == 0
    plain = json.loads((tmp_path / "plain" / "out" / "study.json").read_text())
    assert "nscc.forgive" not in {c["key"] for c in plain["claims"]}
    assert "cc" in plain and plain["cc"] == ["dcqcn"]


def test_an_nscc_run_is_its_own_in_the_cache_and_a_dcqcn_run_keeps_its_key():
    from runplan.fabric import preset
    from runs.cache import config_doc, run_key

    dcqcn = RunConfig(preset("note-4to1"), engine="sim")
    nscc = RunConfig(preset("note-4to1"), engine="sim", cc="nscc")
    assert "cc" not in config_doc(dcqcn) and config_doc(nscc)["cc"] == "nscc"
    assert run_key(dcqcn) != run_key(nscc)


@pytest.mark.parametrize("option", ["--out", "--cache"])
def test_a_results_folder_that_cannot_be_written_is_refused_before_any_run(
    tmp_path, stand_in_engine, capsys, option
):
    taken = tmp_path / "taken"
    taken.write_text("someone's file\n")
    folders = {"--out": tmp_path / "out", "--cache": tmp_path / "cache", option: taken}
    args = ["study", "note", "--seeds", "1", "--out", str(folders["--out"]),
            "--cache", str(folders["--cache"])]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert f"{option} {taken}: exists and is not a folder" in err and "\n" not in err
    assert taken.read_text() == "someone's file\n"
    assert not (tmp_path / "cache" / "calls").exists()  # no run started
