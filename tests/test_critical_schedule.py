"""--critical-steps: the static schedule's critical steps given, so that a shorter run keeps
the note's share of critical steps; the note's schedule when not given, with the run keys
it had."""

from __future__ import annotations

import argparse

import pytest

from commands.train import arguments, training_config
from host_agent.core import StaticSchedule
from runplan.fabric import FabricError, preset
from runplan.run import JOBS, RunConfig, Workload
from runs.cache import config_doc, run_key
from runs.options import add_schedule_option, critical_from
from study.runs import Setup, plan
from study.variants import (
    BY_NAME,
    CRITICAL_MISSED,
    FALSE,
    FALSE_CRITICAL,
    MISSED,
    critical_steps,
    wrong_steps,
)
from workload.plan import TrainingConfig
from workload.rank import make_detector

RANKS = ("10.0.0.1", "10.0.0.2")
NOTE = StaticSchedule(steps=20)


def test_one_constructor_validates_and_gives_the_notes_schedule_one_form():
    for named in ((), (1, 2, 3, 20), (20, 3, 2, 1, 1)):
        assert StaticSchedule.of(20, named) == NOTE and StaticSchedule.of(20, named).setting() == ()
    assert StaticSchedule.of(5, (5, 1, 2, 3)) == StaticSchedule(steps=5)
    assert StaticSchedule.of(2, (2, 1)) == StaticSchedule(steps=2)  # the note's 1, 2, 3, 2
    given = StaticSchedule.of(20, (4, 1, 4))
    assert given.setting() == (1, 4) and given.critical_steps() == {1, 4}
    three = StaticSchedule.of(20, (3, 2, 1))  # the last missing: not the note's schedule
    assert three.setting() == (1, 2, 3) and three != NOTE
    with pytest.raises(ValueError, match=r"^step 6 is outside 1\.\.5$"):
        StaticSchedule.of(5, (1, 6, 0))


def test_the_given_steps_are_the_only_critical_ones():
    cfg = TrainingConfig(ranks=RANKS, rank=0, steps=5, critical=(1,))
    detector = make_detector(cfg)
    assert [detector.classify(s) for s in range(1, 6)] == [True, False, False, False, False]
    default = make_detector(TrainingConfig(ranks=RANKS, rank=0, steps=5))
    assert [default.classify(s) for s in range(1, 6)] == [True, True, True, False, True]
    named = TrainingConfig(ranks=RANKS, rank=0, critical=(20, 1, 2, 3))
    assert make_detector(named) == make_detector(TrainingConfig(ranks=RANKS, rank=0)) == NOTE


def test_the_setting_survives_json_and_bad_ones_are_refused():
    cfg = TrainingConfig(ranks=RANKS, rank=1, steps=5, critical=(1, 4))
    assert TrainingConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match=r"critical: step 6 is outside 1..5"):
        TrainingConfig(ranks=RANKS, rank=0, steps=5, critical=(6,)).validate()
    with pytest.raises(ValueError, match=r"misclassify: step 0 is outside 1..5"):
        TrainingConfig(ranks=RANKS, rank=0, steps=5, misclassify=(0,)).validate()
    with pytest.raises(ValueError, match="static schedule's"):
        TrainingConfig(ranks=RANKS, rank=0, steps=5, critical=(1,), detector="accordion").validate()
    # the JSON keeps the steps as named: `()` is the note's steps of the run's own length
    note = TrainingConfig(ranks=RANKS, rank=1, critical=(1, 2, 3, 20))
    assert TrainingConfig.from_json(note.to_json()) == note


def train_args(*flags: str) -> argparse.Namespace:
    return arguments().parse_args(
        ["--iface", "lo", "--ranks", ",".join(RANKS), "--rank", "0", *flags]
    )


def test_forgive_train_given_the_notes_schedule_runs_the_notes():
    assert training_config(train_args("--critical", "1,2,3,20")).critical == ()
    assert training_config(train_args("--critical", "3,1,3")).critical == (1, 3)
    assert training_config(train_args("--steps", "5", "--critical", "5,3,2,1")).critical == ()
    # the JSON of --config, then the flags on it: the schedule is the merged run's
    cfg = TrainingConfig(ranks=RANKS, rank=0, steps=5, critical=(1,))
    got = training_config(train_args("--config", cfg.to_json(), "--critical", "1,2,3,5"))
    assert got.critical == () and make_detector(got) == StaticSchedule(steps=5)
    given = TrainingConfig(ranks=RANKS, rank=0, steps=5, critical=(4, 1, 4))
    assert training_config(train_args("--config", given.to_json())).critical == (1, 4)
    with pytest.raises(ValueError, match=r"^critical: step 21 is outside 1\.\.20$"):
        training_config(train_args("--critical", "1,21"))


def test_forgive_train_keeps_the_steps_its_config_names_whatever_flags_follow():
    """The note's schedule is a run's 1, 2, 3 and its last, so a --config that names
    1, 2, 3 and 5 of five steps keeps step 5 when --steps makes the run 20 steps long, and
    still refuses the accordion detector, which takes no given steps."""
    named = TrainingConfig(ranks=RANKS, rank=0, steps=5, critical=(1, 2, 3, 5)).to_json()
    longer = training_config(train_args("--config", named, "--steps", "20"))
    assert longer.critical == (1, 2, 3, 5)
    assert make_detector(longer).critical_steps() == {1, 2, 3, 5}
    with pytest.raises(ValueError, match="static schedule's"):
        training_config(train_args("--config", named, "--detector", "accordion"))


def test_misclassification_follows_the_schedule_given():
    assert wrong_steps(CRITICAL_MISSED, 5, (1,)) == (1,)
    assert wrong_steps(FALSE_CRITICAL, 5, (1,)) == (2, 4)
    assert critical_steps(20) == {1, 2, 3, 20} and critical_steps(5, (1,)) == {1}
    assert critical_steps(20, (20, 3, 2, 1)) == critical_steps(20)
    assert wrong_steps(FALSE_CRITICAL, 20, (1, 2, 3, 20)) == wrong_steps(FALSE_CRITICAL, 20)
    with pytest.raises(ValueError, match=r"step 7 is outside 1..5"):
        critical_steps(5, (7,))
    setup = Setup(
        worst=preset("note-4to1"), nonblocking=preset("note-1to1"),
        workload=Workload(steps=5, critical=(1,)), seeds=(1,), baseline_seeds=(1,),
    )  # fmt: skip
    by = {v.name: c for v, c in plan(setup, [BY_NAME[MISSED], BY_NAME[FALSE]])}
    assert by[MISSED].workload.misclassify == (1,) and by[FALSE].workload.misclassify == (2, 4)


def test_runs_on_the_notes_schedule_keep_their_keys_and_a_given_one_is_its_own():
    note = RunConfig(preset("note-4to1"), engine="sim", workload=JOBS["note"])
    short = RunConfig(preset("note-4to1"), engine="sim", workload=Workload(steps=5, critical=(1,)))
    assert "critical" not in config_doc(note)["workload"]
    assert config_doc(short)["workload"]["critical"] == (1,)
    assert run_key(short) != run_key(RunConfig(preset("note-4to1"), engine="sim",
                                               workload=Workload(steps=5)))  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [("1,x", "bad --critical-steps '1,x'"), ("0", "each step must lie in 1..5"), (",", "1..5")],
)
def test_the_option_is_parsed_once_and_bad_lists_are_one_line(text, message):
    parser = argparse.ArgumentParser()
    add_schedule_option(parser)
    assert critical_from(parser.parse_args([]), 5) == ()
    assert critical_from(parser.parse_args(["--critical-steps", "3,1,3"]), 5) == (1, 3)
    # the note's schedule named is the note's schedule: the same runs and cache keys
    assert critical_from(parser.parse_args(["--critical-steps", "5,1,2,3"]), 5) == ()
    named = critical_from(parser.parse_args(["--critical-steps", "20,3,2,1"]), 20)
    assert named == () and run_key(RunConfig(preset("note-4to1"), engine="sim", workload=Workload(
        critical=named))) == run_key(RunConfig(preset("note-4to1"), engine="sim"))  # fmt: skip
    with pytest.raises(FabricError, match=message):
        critical_from(parser.parse_args(["--critical-steps", text]), 5)
