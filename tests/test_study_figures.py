"""The study's figures and verdicts on run records made by hand, each with its answer worked out."""

from __future__ import annotations

import math

import pytest

from runs.results import RunResult, StepResult
from study import figures as fg
from study.claims import ABOVE, BELOW, CLAIMS, EQUAL, WITHIN, Claim, judge


def step(n, critical=False, allreduce=(1.0,), expected=1000, forgiven=0, fifths=None, **kw):
    """A step whose trims per fifth are `fifths` over the whole step, and, unless given, the
    same over its all-reduce."""
    kw.setdefault("allreduce_trim_fifths", fifths)
    return StepResult(
        n, critical, 1.0, list(allreduce), expected, forgiven, 100, True, trim_fifths=fifths, **kw
    )


def run(seed=1, train_s=10.0, steps=None, **kw):
    fields = dict(
        policy="p", seed=seed, fabric="f", time_scale=2.0, training_time_s=train_s,
        steps=steps or [step(1)], data_bytes_sent=1000, retransmitted_bytes=100,
        data_packets_sent=100, trims=3, ce_marks=0, cnps=30, rtos=10, exemption_toggles=[],
        tp_completion_s=[0.1], bound_violations=0,
    )  # fmt: skip
    fields.update(kw)
    return RunResult(**fields)


def test_time_change_pairs_seeds_and_leaves_a_missing_baseline_out():
    runs = {
        "tight": [run(1, 10.0), run(2, 20.0)],
        "forgive": [run(1, 8.0), run(2, 17.0), run(3, 5.0)],
    }
    assert fg.time_change(runs, "forgive") == {1: pytest.approx(-20.0), 2: -15.0, 3: None}
    assert fg.median(fg.time_change(runs, "forgive")) == pytest.approx(-17.5)


def test_metric_ratio_and_change_against_the_baseline():
    tight = run(1, steps=[step(1, True, (0.2,)), step(2, False, (0.4, 0.6))], cnps=30)
    mine = run(1, steps=[step(1, True, (0.22,)), step(2, False, (0.2, 0.3))], cnps=10)
    runs = {"tight": [tight], "forgive": [mine]}
    assert fg.metric_ratio(runs, "forgive", "allreduce_noncritical_ms") == {1: pytest.approx(0.5)}
    assert fg.metric_change(runs, "forgive", "allreduce_critical_ms") == {1: pytest.approx(10.0)}
    assert fg.metric_ratio(runs, "forgive", "cnps") == {1: pytest.approx(1 / 3)}


def test_trims_per_fifth_summed_over_steps():
    # [trimmed, of them gradient, of those forgiven] per fifth
    a = [[700, 600, 60], [100, 100, 0], [0, 0, 0], [0, 0, 0], [50, 50, 25]]
    b = [[700, 400, 120], [0, 0, 0], [0, 0, 0], [0, 0, 0], [150, 150, 95]]
    whole = [[900, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [300, 0, 0]]
    steps = [step(1, fifths=whole, allreduce_trim_fifths=a), step(2, fifths=b), step(3)]
    runs = {"forgive": [run(1, steps=steps)]}
    assert fg.fifths(runs["forgive"][0])[0] == [1400, 1000, 180]
    assert fg.fifths(runs["forgive"][0], fg.STEP)[0] == [1600, 400, 120]
    assert fg.first_last_trimmed(runs, "forgive") == {1: pytest.approx(1600 / 450)}
    ratio = fg.first_last_trimmed(runs, "forgive", fg.ALLREDUCE, fg.GRADIENT_TRIMMED)
    assert ratio == {1: pytest.approx(1000 / 200)}
    assert fg.forgiven_share(runs, "forgive", fg.FIRST) == {1: pytest.approx(18.0)}
    assert fg.forgiven_share(runs, "forgive", fg.LAST) == {1: pytest.approx(60.0)}
    assert fg.first_last_trimmed({"forgive": [run(1)]}, "forgive") == {1: None}


def test_obeying_again_share_and_mean_time_in_fabric_ms():
    ex = {
        "exempt_flows": 100,
        "obeyed_again_flows": 19,
        "obeying_again_episodes": 25,
        "obeying_again_s": 19 * 0.34e-3,  # the run's clock, twice the fabric's
    }
    runs = {"forgive": [run(1, exemption=ex)], "tight": [run(1, exemption={})]}
    assert fg.obeyed_again_pct(runs, "forgive") == {1: pytest.approx(19.0)}
    assert fg.obeying_again_ms(runs, "forgive") == {1: pytest.approx(0.17)}
    assert fg.obeyed_again_pct(runs, "tight") == {1: None}


def test_eligible_trims_saving_split_and_second_job():
    runs = {
        "tight": [run(1, 100.0, trimmed_bytes={"eligible": 10, "other": 5})],
        "P0": [run(1, 85.0)],
        "forgive": [run(1, 84.0, trimmed_bytes={"eligible": 100, "other": 5})],
        "co:tight": [run(1, companion=run(1, 50.0).to_json())],
        "co:forgive": [run(1, companion=run(1, 45.0).to_json())],
    }
    assert fg.eligible_trimmed_ratio(runs, "forgive", "tight") == {1: pytest.approx(10.0)}
    assert fg.exemption_share(runs, "P0", "forgive") == {1: pytest.approx(100 * 15 / 16)}
    assert fg.forgiveness_points(runs, "P0", "forgive") == {1: pytest.approx(1.0)}
    assert fg.companion_change(runs, "co:forgive", "co:tight", shared=False) == {
        1: pytest.approx(-10.0)
    }
    assert fg.saving_lost_pct(runs, "P0", "forgive") == {1: pytest.approx(100 / 16)}


def test_the_second_job_pays_only_for_the_steps_both_runs_shared():
    """Beside forgive the first job ends at t = 3, so the second job shared its steps 1 and 2
    (2 s and 1 s); beside tight the first job ends at 4.5 and every step (1.5 s each) was
    shared. Over steps 1 and 2: 3 s against 3 s."""

    def steps(durations, ends):
        return [
            StepResult(k, False, d, [0.1], 10, 0, 0, True, ended_s=e)
            for k, (d, e) in enumerate(zip(durations, ends, strict=True), 1)
        ]

    beside_forgive = run(1, 4.0, steps=steps([2.0, 1.0, 1.0], [2.0, 3.0, 4.0]))
    beside_tight = run(1, 5.5, steps=steps([1.5, 1.5, 2.5], [1.5, 3.0, 4.5]))
    runs = {
        "co:forgive": [
            run(1, steps=steps([1.0] * 3, [1.0, 2.0, 3.0]), companion=beside_forgive.to_json())
        ],
        "co:tight": [
            run(1, steps=steps([1.5] * 3, [1.5, 3.0, 4.5]), companion=beside_tight.to_json())
        ],
    }
    assert fg.shared_steps(runs["co:forgive"][0]) == {1: 2.0, 2: 1.0}
    assert fg.companion_change(runs, "co:forgive", "co:tight") == {1: pytest.approx(0.0)}
    whole = fg.companion_change(runs, "co:forgive", "co:tight", shared=False)
    assert whole == {1: pytest.approx(100 * (4.0 - 5.5) / 5.5)}
    assert fg.shared_steps(run(1)) == {}


def test_loss_on_truly_critical_steps_undoes_the_detectors_mistakes():
    steps = [
        step(1, critical=False, misclassified=True, expected=1000, forgiven=80),  # truly critical
        step(2, critical=True, misclassified=True, expected=1000, forgiven=5),  # truly not
        step(3, critical=True, expected=1000, forgiven=2),  # truly critical, seen as such
        step(4, critical=False, expected=1000, forgiven=90),
    ]
    runs = {"missed": [run(1, steps=steps)]}
    assert fg.lost_on_true_critical_pct(runs, "missed") == {1: pytest.approx(100 * 82 / 2000)}


def test_the_bound_must_hold_for_every_variant_on_a_seed():
    runs = {"a": [run(1), run(2)], "b": [run(1, bound_violations=1), run(2)]}
    assert fg.bound_held(runs, ["a", "b"]) == {1: 0.0, 2: 1.0}


def test_allreduce_times_for_a_cdf_in_fabric_ms():
    r = run(1, steps=[step(1, True, (0.004,)), step(2, False, (0.002, 0.006))])
    assert fg.allreduce_times_ms([r]) == pytest.approx([1.0, 2.0, 3.0])
    assert fg.allreduce_times_ms([r], critical=True) == pytest.approx([2.0])


def claim(direction, reference, note, values, ratio=False):
    return Claim(
        "k", "figure", "R", "quote", note, direction, reference, lambda runs: values, ratio
    )


@pytest.mark.parametrize(
    ("made", "direction", "magnitude"),
    [
        # -16.4 against a note of -16.7..-16.1: same side of 0, half as far is still within x2
        (claim(BELOW, 0.0, (-16.7, -16.1), {1: -8.1, 2: -8.3, 3: -9.0}), True, True),
        (claim(BELOW, 0.0, (-16.7, -16.1), {1: -7.0, 2: -8.0, 3: -9.0}), True, False),
        (claim(BELOW, 0.0, (-16.7, -16.1), {1: 1.0}), False, False),
        # ratios are judged on logarithms: 0.3 against 0.54 is log 1.20 against 0.62
        (claim(BELOW, 1.0, (0.54, 0.54), {1: 0.3}, ratio=True), True, True),
        (claim(BELOW, 1.0, (0.54, 0.54), {1: 0.2}, ratio=True), True, False),
        # "more than half": at least half as far from 1 as 0.5 on a log scale, i.e. <= 0.707
        (claim(BELOW, 1.0, (None, 0.5), {1: 0.7}, ratio=True), True, True),
        (claim(BELOW, 1.0, (None, 0.5), {1: 0.75}, ratio=True), True, False),
        # a band: the median inside it, every seed within twice it
        (claim(WITHIN, (-1.1, 0.8), (-1.1, 0.8), {1: -0.5, 2: 2.0, 3: 0.1}), True, True),
        (claim(WITHIN, (-1.1, 0.8), (-1.1, 0.8), {1: -3.0, 2: -2.0, 3: 0.1}), False, False),
        (claim(EQUAL, 0.0, (0.0, 0.0), {1: 0.0, 2: 0.0}), True, True),
        # no number in the note: only the direction is judged
        (claim(ABOVE, 0.0, None, {1: 3.0}), True, None),
        (claim(ABOVE, 0.0, None, {1: None}), None, None),
    ],
)
def test_verdicts_by_hand(made, direction, magnitude):
    (verdict,) = judge([made], {})
    assert (verdict.direction, verdict.magnitude) == (direction, magnitude)


def test_a_direction_against_another_claims_figure():
    forgive = Claim("a", "f", "R", "q", (7.5, 7.6), ABOVE, 0.0, lambda runs: {1: 5.0, 2: 6.0})
    shed = Claim("b", "f", "R", "q", (8.1, 8.1), ABOVE, "a", lambda runs: {1: 4.0, 2: 5.0})
    verdicts = judge([forgive, shed], {})
    assert verdicts[1].median == 4.5 and verdicts[1].direction is False
    assert verdicts[1].magnitude is True  # 4.5 is within a factor of two of 8.1


def test_every_claim_of_the_study_has_a_figure_and_a_readable_note_value():
    keys = [c.key for c in CLAIMS]
    assert len(keys) == len(set(keys))
    for c in CLAIMS:
        assert c.quote and c.where and c.note_text()
        if isinstance(c.reference, str):
            assert c.reference in keys, c.key
        (verdict,) = judge([c], {})
        assert verdict.median is None and verdict.direction is None
    assert math.isclose(next(c for c in CLAIMS if c.key == "ar.noncritical").note[0], 17.4 / 32.3)


def study_runs():
    """Tight and forgive on three seeds, forgive 16 % faster and forgiving 7.5 % of its bytes."""
    from study import variants as v

    fifths = [[700, 600, 60], [100, 100, 10], [0, 0, 0], [0, 0, 0], [100, 100, 60]]
    runs = {}
    for seed in (1, 2, 3):
        base = 100.0 + seed
        runs.setdefault(v.TIGHT, []).append(run(seed, base, steps=[step(1, fifths=fifths)]))
        runs.setdefault(v.FORGIVE, []).append(
            run(seed, base * 0.84, steps=[step(1, fifths=fifths, forgiven=75)])
        )
    return runs


def test_the_report_writes_a_table_json_and_plots(tmp_path):
    import json

    from study import report
    from study import variants as v

    runs = study_runs()
    verdicts = judge(CLAIMS, runs)
    from test_study_report import labelled

    table = report.write(tmp_path, verdicts, runs, {"engine": "test"}, labelled(runs))
    lines = table.splitlines()
    row = next(line for line in lines if "forgive: training time vs tight" in line)
    assert "-16.7..-16.1" in row and "-16.0 (3)" in row and row.rstrip().endswith("yes  yes")
    assert any(line.startswith('[1] Results ¶2: "cut the 20-step') for line in lines)
    assert "direction reproduced on" in lines[-1]
    doc = json.loads((tmp_path / "study.json").read_text())
    assert doc["engine"] == "test" and doc["variants"][v.FORGIVE] == [1, 2, 3]
    first = next(c for c in doc["claims"] if c["key"] == "fifths.first")
    assert first["values"] == {"1": 10.0, "2": 10.0, "3": 10.0} and first["direction"] is True
    for name in ("allreduce_cdf.png", "trims_per_fifth.png", "time_vs_baseline.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_a_figure_the_runs_leave_without_value_reads_undefined_not_unmeasured():
    from study import report

    measured = Claim("a", "zero over zero", "R", "q", (10.0, 10.0), ABOVE, 1.0, lambda r: {1: None})
    missing = Claim("b", "never run", "R", "q", (10.0, 10.0), ABOVE, 1.0, lambda r: {})
    rows = report.format_table(judge([measured, missing], {})).splitlines()
    assert "undefined (1)" in next(line for line in rows if "zero over zero" in line)
    never = next(line for line in rows if "never run" in line).split()
    assert never[-4:] == ["-", "-", "-", "-"]
