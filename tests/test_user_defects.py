"""What a new user hit (issue 37): each defect, held by a test that failed before its fix.

1. the simulator's trims plot spent its x-axis on the ranks' linger after training, and a
   policy's line could hide under another's;
2. --timeout under the simulator counted that linger, and its help said neither its clock nor
   its default;
3. a compare whose every step is critical printed tight's and forgive's rows alike, silently;
4. help texts without their defaults, a Python repr, a group's text repeated, a command line
   that spoke of Mininet alone;
5. refusals without the option's name, worded two ways for one option, wrong about four
   frames, without the known variants, or under the top-level usage.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_study_figures import run, step

from commands import forgive
from runs import plots
from runs.report import write_results

SIM = ["--engine", "sim"]


def _forgive(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "commands.forgive", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_1_the_trims_plot_ends_with_the_counters_and_shows_coinciding_lines(tmp_path, monkeypatch):
    shown = {}

    def keep(fig, path):
        ax = fig.axes[0]
        shown["xlim"] = ax.get_xlim()
        shown["styles"] = [(line.get_linestyle(), line.get_linewidth()) for line in ax.lines]

    monkeypatch.setattr(plots, "save_figure", keep)
    # trims until 4.4 ms, then a flat tail to 200 ms (the simulator's ranks linger 0.2 s)
    timeline = [{"t": t / 1e4, "trims": min(t, 44), "ce_marks": min(t, 40)} for t in range(2001)]
    runs = [run(policy=p, timeline=timeline) for p in ("tight", "dcqcn")]
    plots.plot_trims(tmp_path / "trims.png", runs, ["tight", "dcqcn"])
    assert shown["xlim"][1] < 0.005
    assert len(set(shown["styles"])) == 2, "the two identical lines are drawn alike"


def test_2_the_simulators_timeout_bounds_training_and_its_help_says_so(tmp_path):
    done = _forgive("run", *SIM, "--steps", "2", "--timeout", "0.01", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = _forgive("run", "--help").stdout
    assert "virtual time until training ends" in text and "(default 600)" in text


def test_3_a_table_whose_every_step_was_critical_says_so(tmp_path):
    critical = [run(policy=p, steps=[step(1, critical=True), step(2, critical=True)])
                for p in ("tight", "forgive")]  # fmt: skip
    table = write_results(tmp_path, critical, ["tight", "forgive"])
    assert "every step of every run was critical" in table
    assert "forgive ran as tight" in (tmp_path / "table.txt").read_text()
    mixed = [run(policy=p, steps=[step(1, critical=True), step(2)]) for p in ("tight", "forgive")]
    assert "critical" not in write_results(tmp_path / "mixed", mixed, ["tight", "forgive"])


@pytest.mark.parametrize(
    ("args", "shown", "not_shown"),
    [
        (["--help"], ["simulated", "--engine sim"], []),
        (["run", "--help"], ["default forgive)", "the run's seed (default 1)",
                             "default or note, the first when not given", "(default static)",
                             "default results/<time>-<fabric>", "--pcap LINKS"],
         ["default, note (default)"]),
        (["compare", "--help"], ["comma-separated; each policy runs once per seed (default 1,2)",
                                 "default tight,forgive,dcqcn,shed)",
                                 "--engine sim; default 1)"], []),
        (["study", "note", "--help"], ["(default: note-4to1 under sim", "default 20"],
         ["`calibrate`: the note's calibration"]),
        (["impact", "--help"], ["MLP hidden width (default", "training seeds (default 1,2,3,4,5)",
                                "steps of the drift measurement (default"], []),
        (["clean", "--help"], ["Remove the veths and switch processes"], []),
    ],
)  # fmt: skip
def test_4_help_states_defaults_once_and_plainly(args, shown, not_shown, capsys):
    with pytest.raises(SystemExit):
        forgive.main(args)
    text = " ".join(capsys.readouterr().out.split())
    for phrase in shown:
        assert phrase in text, phrase
    for phrase in not_shown:
        assert phrase not in text, phrase


def test_4_the_other_commands_help():
    train = subprocess.run([sys.executable, "-m", "commands.train", "--help"], capture_output=True,
                           text=True, timeout=60).stdout  # fmt: skip
    assert "--compute-ms COMPUTE_MS" in train and "default ()" not in train
    assert "--critical CRITICAL" in train and "default none" in train
    ctl = subprocess.run([sys.executable, "-m", "commands.ctl", "--help"], capture_output=True,
                         text=True, timeout=60).stdout  # fmt: skip
    assert "apply: configure every switch" in " ".join(ctl.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", *SIM, "--steps", "0"], "forgive: --steps must lie in 1..4095, got 0"),
        (["run", *SIM, "--byte-scale", "0.5"], "forgive: --byte-scale must be a finite number >= 1, got 0.5"),
        (["run", *SIM, "--byte-scale", "0"], "forgive: --byte-scale must be a finite number >= 1, got 0.0"),
        (["study", "regime", "--byte-scale", "256", "--cells", "base"],
         "under 4 full frames (4 x 4154 = 16616 B)"),
        (["study", "note", "--variants", "forgve"], "unknown variant 'forgve' (known: tight, forgive"),
    ],
)  # fmt: skip
def test_5_refusals_name_their_option_in_one_line(tmp_path, args, message):
    proc = _forgive(*args, "--out", str(tmp_path / "out"), *(["--cache", str(tmp_path / "c")]
                    if args[0] == "study" else []))  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_5_a_mistyped_option_is_the_commands_own_error():
    proc = _forgive("run", "--stpes", "2")
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: forgive run ")
    assert "forgive run: error: unrecognized arguments: --stpes 2" in proc.stderr


def test_a_run_writes_runs_csv_and_a_pdf_beside_every_plot(tmp_path):
    pandas = pytest.importorskip("pandas")
    assert forgive.main(["compare", *SIM, "--steps", "2", "--policies", "tight,forgive",
                         "--seeds", "1", "--out", str(tmp_path)]) == 0  # fmt: skip
    pngs = sorted(tmp_path.glob("*.png"))
    assert len(pngs) == 3 and all(p.with_suffix(".pdf").stat().st_size > 1000 for p in pngs)
    frame = pandas.read_csv(tmp_path / "runs.csv")
    assert list(frame.columns[:8]) == [
        "variant",
        "fabric",
        "engine",
        "policy",
        "seed",
        "byte_scale",
        "steps",
        "time_scale",
    ]
    assert list(frame["policy"]) == ["tight", "forgive"] and set(frame["engine"]) == {"sim"}
    assert set(frame["steps"]) == {2} and set(frame["byte_scale"]) == {64}
    # durations name their clock; nothing is empty in every row
    assert "training_time_s" not in frame and "fabric_training_time_ms" not in frame
    assert "trims_last_hop" not in frame and not frame.isna().all().any()
    run_ms, fabric_ms = frame["training_time_run_ms"], frame["training_time_fabric_ms"]
    assert list(fabric_ms) == pytest.approx(list(run_ms / frame["time_scale"]))
