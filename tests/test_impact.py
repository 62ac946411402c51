"""forgive impact: the ring replay applies each loss where it belongs, renormalisation is exact,
the drift estimator finds known answers, and the whole command runs on a tiny model."""

import json

import pytest

torch = pytest.importorskip("torch", reason="forgive impact needs PyTorch (the impact extra)")
pytest.importorskip("sklearn", reason="forgive impact's data set ships with scikit-learn")

from commands import forgive as cli  # noqa: E402
from host_agent.policies import P_HIGH, P_LOW, shed_draw  # noqa: E402
from impact.config import ImpactConfig, ModelSpec  # noqa: E402
from impact.drift import (  # noqa: E402
    gap_probabilities,
    lag_prediction,
    pair_drift,
    paper_constant,
    review_constant,
    simulate_independent_updates,
    steady_ratio,
)
from impact.experiment import (  # noqa: E402
    ImpactError,
    Replay,
    choose_runs,
    detector_replay,
    run,
)
from impact.layout import GradientLayout  # noqa: E402
from impact.masks import (  # noqa: E402
    COMPARISONS,
    RECORDED,
    SHED,
    UNIFORM,
    comparison_loss,
    lost_bytes,
    uniform_packets,
)
from impact.report import write  # noqa: E402
from impact.ring import RENORMALISE, ZERO_FILL, Ring  # noqa: E402
from runs.report import COMPLETE, RUNS  # noqa: E402
from runs.results import RunResult, StepResult  # noqa: E402
from workload.lossrecord import (  # noqa: E402
    ALL_GATHER,
    FORGIVEN,
    REDUCE_SCATTER,
    Layout,
    LossEntry,
    LossRecord,
    StepClass,
)
from workload.plan import Kind, chunk_owner, flow_id, ring_chunk  # noqa: E402

N = 4
K = 4096


def ring_for(elements_per_chunk=2048, ranks=N):
    """A ring whose model buffer has exactly the record's bytes, so ranges map one to one."""
    record = Layout(ranks, ranks * elements_per_chunk * 4, 6)
    return Ring(GradientLayout.of([("w", (ranks * elements_per_chunk,))], ranks), record), record


def powers(ring):
    """Rank r contributes 2**r everywhere: every partial sum says exactly who is in it."""
    return torch.stack([torch.full((ring.layout.elements,), 2.0**r) for r in range(ring.n)])


def test_no_loss_all_reduce_is_the_mean_and_renormalisation_is_exact():
    ring, _ = ring_for()
    grads = torch.randn(N, ring.layout.elements, generator=torch.Generator().manual_seed(1))
    plain = ring.all_reduce(grads, {}, ZERO_FILL)
    renormalised = ring.all_reduce(grads, {}, RENORMALISE)
    assert torch.equal(plain, renormalised)  # sum / count with every count n: bit for bit
    for r in range(N):
        assert torch.equal(plain[r], plain[0])
    assert torch.allclose(plain[0], grads.mean(dim=0), atol=1e-6)


def test_a_lost_reduce_scatter_range_drops_exactly_that_partial_sum():
    ring, _ = ring_for()
    j, src = 1, 2  # rank 2 forwards chunk 1 (ranks 1 and 2 summed) to rank 3
    chunk = ring_chunk(src, j, N)
    loss = {(j, src): [(K, 2 * K)]}  # bytes [4096, 8192): elements [1024, 2048) of the chunk
    hops = ring.hop_losses(loss)
    first = ring.layout.chunks[chunk][0]
    lost = slice(first + 1024, first + 2048)
    for treatment, expect in ((ZERO_FILL, (8 + 1) / N), (RENORMALISE, (8 + 1) / 2)):
        out = ring.all_reduce(powers(ring), hops, treatment)
        # ranks 3 and 0 (the owner) still add 8 and 1; the partial 2 + 4 is gone
        assert torch.all(out[:, lost] == expect)
        untouched = torch.ones(ring.layout.elements, dtype=torch.bool)
        untouched[lost] = False
        assert torch.all(out[:, untouched] == 15 / N)


def test_a_lost_all_gather_range_leaves_that_rank_and_those_after_it_without():
    ring, _ = ring_for()
    j, src = N - 1, 1  # all-gather step 0: rank 1 sends its reduced chunk 2 to rank 2
    chunk = ring_chunk(src, j, N)
    assert chunk_owner(chunk, N) == src
    hops = ring.hop_losses({(j, src): [(0, K)]})
    first = ring.layout.chunks[chunk][0]
    lost = slice(first, first + 1024)
    zero = ring.all_reduce(powers(ring), hops, ZERO_FILL)
    # ranks 2, 3 and 0 receive chunk 2 through the hole, in that order; the owner keeps it
    assert torch.all(zero[1, lost] == 15 / N)
    for r in (2, 3, 0):
        assert torch.all(zero[r, lost] == 0)
    renorm = ring.all_reduce(powers(ring), hops, RENORMALISE)
    # rank 2 falls back on its own partial sum of chunk 2: ranks 2 alone (it started it)
    assert torch.all(renorm[2, lost] == 4.0)
    assert torch.all(renorm[3, lost] == 4.0) and torch.all(renorm[0, lost] == 4.0)
    direct = ring.all_gather(torch.full((ring.layout.elements,), 7.0), powers(ring), hops,
                             RENORMALISE, direct=True)  # fmt: skip
    assert torch.all(direct[2, lost] == 4.0) and torch.all(direct[3, lost] == 7.0)


def test_zero_fill_works_at_byte_granularity():
    ring, _ = ring_for()
    grads = torch.randn(N, ring.layout.elements, generator=torch.Generator().manual_seed(2))
    hops = ring.hop_losses({(N - 1, 1): [(0, 2)]})  # the two low bytes of one float32
    clean = ring.all_reduce(grads, {}, ZERO_FILL)
    out = ring.all_reduce(grads, hops, ZERO_FILL)
    first = ring.layout.chunks[ring_chunk(1, N - 1, N)][0]
    expected = clean[1, first : first + 1].clone()
    expected.view(torch.uint8)[:2] = 0  # little-endian: the low mantissa bytes
    assert torch.equal(out[2, first : first + 1], expected) and expected[0] != clean[1, first]
    assert torch.equal(out[2, first + 1 :], clean[2, first + 1 :])


def test_recorded_ranges_are_rescaled_onto_a_model_of_another_size():
    record = Layout(N, N * 100 * K, 6)  # 100 packets per chunk in the run
    ring = Ring(
        GradientLayout.of([("w", (N * 10_000,))], N), record
    )  # 40,000 model bytes per chunk
    hops = ring.hop_losses({(0, 3): [(10 * K, 20 * K), (50 * K, 100 * K)]})
    lost = hops[0, 3]
    assert int(lost.bytes_lost.sum()) == 4_000 + 20_000
    assert lost.bytes_lost[4_000] and not lost.bytes_lost[3_999] and lost.bytes_lost[-1]
    assert int(lost.elements_lost.sum()) == 1_000 + 5_000


def test_drift_estimator_averages_non_owner_pairs():
    n, per = 4, 3
    copies = torch.zeros(n, n * per)
    chunks = [(c * per, per) for c in range(n)]
    # in chunk 0 (owned by rank 3) ranks 0, 1, 2 hold 0, 1, 3: pairs give 1, 9, 4
    copies[1, 0:per] = 1.0
    copies[2, 0:per] = 3.0
    copies[3, 0:per] = 100.0  # the owner never counts
    assert pair_drift(copies, chunks) == pytest.approx((1 + 9 + 4) / (3 * n))
    assert pair_drift(torch.zeros(2, 4), [(0, 2), (2, 2)]) != pair_drift(
        torch.zeros(2, 4), [(0, 2), (2, 2)]
    )


def test_lag_model_pieces_agree_with_the_review():
    for p in (0.05, 0.1, 0.5):
        probs = gap_probabilities(p, 400)
        assert sum(probs) == pytest.approx(1.0)
        assert sum(m * q for m, q in enumerate(probs)) == pytest.approx(review_constant(p))
        assert lag_prediction(p, [2.5]) == pytest.approx(2.5 * review_constant(p))
    assert paper_constant(0.1) == pytest.approx(0.2 / 1.1)
    assert review_constant(0.1) == pytest.approx(0.2 / (0.9 * 1.1))


def test_independent_drops_of_iid_updates_give_the_reviews_constant():
    torch.set_num_threads(1)
    ring, _ = ring_for(elements_per_chunk=16 * 1024)  # 16 packets per chunk
    p = 0.5
    drift, update_sq = simulate_independent_updates(ring, p, 300, seed=3)
    ratio = steady_ratio(drift, update_sq, 1, range(20, 300))
    assert ratio == pytest.approx(review_constant(p), rel=0.05)  # 4/3
    assert abs(ratio - paper_constant(p)) > 0.5  # 2/3


def small_record(steps=6):
    layout = Layout(N, N * 8 * K, steps)
    classes = [StepClass(s, s in (1, 2, 3, steps), P_LOW if s in (1, 2, 3, steps) else P_HIGH)
               for s in range(1, steps + 1)]  # fmt: skip
    entries = [
        LossEntry(4, 0, 1, REDUCE_SCATTER, 1, ring_chunk(0, 1, N), flow_id(4, Kind.GRADIENT, 0, 1),
                  ((0, 2 * K, FORGIVEN),)),
        LossEntry(5, 2, 3, ALL_GATHER, 0, ring_chunk(2, N - 1, N), flow_id(5, Kind.GRADIENT, 2, N - 1),
                  ((K, 3 * K, FORGIVEN), (5 * K, 6 * K, FORGIVEN))),
    ]  # fmt: skip
    return LossRecord(layout, classes, entries, "test")


def test_comparison_masks_have_the_recorded_rate_and_shape():
    rec = small_record()
    recorded = comparison_loss(RECORDED, rec, 1)
    assert recorded[4] == {(1, 0): [(0, 2 * K)]} and recorded[1] == {}
    assert lost_bytes(recorded[5]) == 3 * K
    shed = comparison_loss(SHED, rec, 1)
    for step, loss in shed.items():
        for (j, src), ranges in loss.items():
            assert shed_draw(1, step, flow_id(step, Kind.GRADIENT, src, j)) < rec.step_rate(step)
            assert ranges == [(0, rec.layout.chunks[ring_chunk(src, j, N)][1])]
    assert comparison_loss(UNIFORM, rec, 1)[1] == {}  # nothing was lost on step 1
    big = Layout(N, N * 1000 * K, 6)
    share = lost_bytes(uniform_packets(big, 1, 0.1, "k")) / big.step_bytes()
    assert share == pytest.approx(0.1, abs=0.01)
    with pytest.raises(ValueError, match="unknown comparison"):
        comparison_loss("bursty", rec, 1)


def test_detector_replay_counts_and_costs_the_disagreements():
    rec = small_record()
    norms = [10.0, 4.0, 3.9, 3.8, 3.8, 3.8]  # the fall after step 1 ends the critical regime
    out = detector_replay(norms, rec)
    assert out["run_critical"] == [1, 2, 3, 6]
    # step s is classified from the norm of s - 1: 10 -> 4 is a 60 % change, 4 -> 3.9 is not
    assert out["accordion_critical"] == [1, 2, 3]
    assert out["differ"] == [6] and out["missed"] == [6]
    step_bytes = rec.layout.step_bytes()
    assert out["budget_change_bytes"] == pytest.approx((P_HIGH - P_LOW) * step_bytes)
    usual = (rec.step_rate(4) + rec.step_rate(5)) / 2
    assert out["forgiven_change_bytes"] == pytest.approx(usual * step_bytes)


def critical_only_at_1(steps=6) -> LossRecord:
    """small_record as a run made with `--critical-steps 1` records it: step 1 critical."""
    rec = small_record(steps)
    rec.steps = [
        StepClass(c.step, c.step == 1, P_LOW if c.step == 1 else P_HIGH) for c in rec.steps
    ]
    return rec


def test_detector_replay_measures_against_the_runs_own_schedule():
    """A run made with --critical-steps 1: Accordion's steps 2 and 3 are critical where the
    run's were not, so the budget shrinks by two steps' worth; the note's default schedule
    (1, 2, 3, 6) would have put the difference on step 6 and grown it instead."""
    rec = critical_only_at_1()
    out = detector_replay([10.0, 4.0, 3.9, 3.8, 3.8, 3.8], rec)
    assert out["run_critical"] == [1]
    assert out["accordion_critical"] == [1, 2, 3]
    assert out["differ"] == [2, 3] and out["missed"] == []
    step_bytes = rec.layout.step_bytes()
    assert out["budget_change_bytes"] == pytest.approx(-2 * (P_HIGH - P_LOW) * step_bytes)
    lost = sum(max(rec.step_rate(s) - P_LOW, 0.0) for s in (2, 3))
    assert out["forgiven_change_bytes"] == pytest.approx(-lost * step_bytes)


def run_result(seed, record, policy="forgive"):
    steps = [
        StepResult(s, False, 1.0, [1.0], 100, 0, 10, True)
        for s in range(1, record.layout.steps + 1)
    ]
    return RunResult(policy=policy, seed=seed, fabric="2to1", time_scale=1.0, training_time_s=6.0,
                     steps=steps, data_bytes_sent=1, retransmitted_bytes=0, data_packets_sent=1, trims=0,
                     ce_marks=0, cnps=0, rtos=0, exemption_toggles=[], tp_completion_s=[],
                     bound_violations=0, loss=record.to_json())  # fmt: skip


def finished(folder, text: str, encoding: str = "utf-8") -> None:
    """A results folder as a finished `forgive run` leaves it: runs.json, then the mark."""
    (folder / RUNS).write_text(text, encoding=encoding)
    (folder / COMPLETE).write_text("{}")


def test_runs_are_chosen_per_seed_and_in_turn():
    rec = small_record()
    runs = [run_result(1, rec), run_result(2, rec), run_result(1, rec, "shed")]
    picks = choose_runs(runs, "forgive", (2, 7, 8))
    assert [(r.seed, r.run_seed) for r in picks] == [(2, 2), (7, 2), (8, 1)]
    assert [r.run_seed for r in choose_runs(runs, None, (1,))] == [1]  # forgive preferred
    with pytest.raises(ImpactError, match="pick one with --policy"):
        choose_runs([run_result(1, rec, "a"), run_result(1, rec, "b")], None, (1,))
    with pytest.raises(ImpactError, match="no run of policy 'tight'"):
        choose_runs(runs, "tight", (1,))
    old = run_result(1, rec)
    old.loss = None
    with pytest.raises(ImpactError, match="no run in these results has a loss record"):
        choose_runs([old], None, (1,))
    with pytest.raises(ImpactError, match="differ in ranks or steps"):
        choose_runs([run_result(1, rec), run_result(2, small_record(steps=7))], None, (1,))


TINY = ImpactConfig(spec=ModelSpec(hidden=8, batch=8), seeds=(1, 2), drift_steps=8, burn_in=3)


def test_a_tiny_replay_produces_every_comparison_and_output(tmp_path):
    rec = small_record()
    replays = [Replay(s, "forgive", 1, rec) for s in TINY.seeds]
    results = run(TINY, replays, progress=lambda line: None)
    trainings = results.trainings
    assert set(trainings) == {"no-loss"} | {
        f"{c}/{t}" for c in COMPARISONS[1:] for t in (ZERO_FILL, RENORMALISE)
    }
    for seed in TINY.seeds:
        assert trainings["no-loss"][seed]["applied_loss"] == [0.0] * 6
        assert trainings["no-loss"][seed]["drift"] == [0.0] * 6  # replicas never part without loss
        rec_trace = trainings["recorded/zero-fill"][seed]
        assert rec_trace["applied_loss"] == pytest.approx([rec.step_rate(s) for s in range(1, 7)])
        assert rec_trace["drift"][3] == 0.0  # a reduce-scatter loss changes every view alike
        assert rec_trace["drift"][4] > 0  # the all-gather loss on step 5 split the replicas
        assert (
            all(0 <= a <= 1 for a in rec_trace["test_accuracy"])
            and len(rec_trace["test_loss"]) == 6
        )
    assert set(results.drift) == {"iid-updates", "independent", "independent-ring", "recorded"}
    text = write(tmp_path, results)
    assert text.splitlines()[0].split()[:2] == ["training", "seeds"]
    assert "supports" in text and "Accordion" in text
    doc = json.loads((tmp_path / "impact.json").read_text())
    assert doc["summary"]["recorded/zero-fill"]["seeds"] == [1, 2]
    for name in ("loss_curves.png", "accuracy_curves.png", "drift.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_the_cli_replays_a_results_folder_and_refuses_bad_input(tmp_path, capsys):
    rec = small_record()
    finished(tmp_path, json.dumps([run_result(1, rec).to_json()]))
    args = ["impact", str(tmp_path), "--hidden", "8", "--batch", "8", "--seeds", "1",
            "--drift-steps", "6", "--burn-in", "2"]  # fmt: skip
    assert cli.main(args) == 0
    assert (tmp_path / "impact" / "table.txt").read_text().startswith("training")
    assert "seed 1 replays forgive seed 1" in capsys.readouterr().err
    for bad, message in [
        (["--seeds", "1,x"], "bad --seeds"),
        (["--drift-steps", "2"], "must exceed the burn-in"),
        (["--policy", "tight"], "no run of policy"),
        (["--hidden", "0"], "must be >= 1"),
    ]:
        assert cli.main([*args, *bad]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert cli.main(["impact", str(tmp_path / "missing")]) == 2
    assert "no runs.json" in capsys.readouterr().err


def test_a_run_whose_every_step_is_critical_replays_without_the_recorded_drift(tmp_path, capsys):
    """A plain `forgive run --steps 4` is critical throughout: the recorded drift arm, which
    averages over non-critical steps, is left out and said to be, the rest is replayed."""
    rec = small_record()
    rec.steps = [StepClass(c.step, True, P_LOW) for c in rec.steps]
    finished(tmp_path, json.dumps([run_result(1, rec).to_json()]))
    args = ["impact", str(tmp_path), "--hidden", "8", "--batch", "8", "--seeds", "1",
            "--drift-steps", "6", "--burn-in", "2"]  # fmt: skip
    assert cli.main(args) == 0
    assert (
        "drift, recorded: not measured, every one of the run's 6 steps" in capsys.readouterr().err
    )
    doc = json.loads((tmp_path / "impact" / "impact.json").read_text())
    assert doc["drift_table"]["recorded"]["measured"] == []
    assert doc["drift_table"]["independent"]["measured"]  # the other arms still measured
    assert "every step of the run is critical" in (tmp_path / "impact" / "table.txt").read_text()


def test_the_cli_names_the_runs_own_critical_steps(tmp_path, capsys):
    finished(tmp_path, json.dumps([run_result(1, critical_only_at_1()).to_json()]))
    assert cli.main(["impact", str(tmp_path), *TINY_ARGS]) == 0
    table = (tmp_path / "impact" / "table.txt").read_text()
    assert "against the run's own critical steps [1]:" in table
    assert json.loads((tmp_path / "impact" / "impact.json").read_text())["detector"]["1"][
        "run_critical"
    ] == [1]


TINY_ARGS = [
    "--hidden",
    "8",
    "--batch",
    "8",
    "--seeds",
    "1",
    "--drift-steps",
    "6",
    "--burn-in",
    "2",
]


def _deep(depth):
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_deep(100_000), "nested too deep"),
        ("[1]", "run 1: expected an object, got 1"),
        ("[{}]", "run 1: missing field 'policy'"),
        ("{}", "expected a list of runs"),
        ("\xff", "not JSON"),
        ("not json", "not JSON"),
    ],
    ids=["nested-100000-deep", "a-number", "an-empty-object", "not-a-list", "not-utf8", "not-json"],
)
def test_the_cli_refuses_a_malformed_runs_json_in_one_line(tmp_path, capsys, text, message):
    finished(tmp_path, text, encoding="latin-1")
    assert cli.main(["impact", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "impact").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"training_time_s": float("nan")}, "training_time_s: nan is not a finite number"),
        ({"seed": 2**80}, "seed: 1208925819614629174706176 is beyond a 64-bit integer"),
        ({"policy": 7}, "policy: expected a string, got 7"),
        ({"seed": True}, "seed: expected an integer, got True"),
        ({"surprise": 1}, "unknown field 'surprise'"),
    ],
)
def test_the_cli_refuses_a_run_whose_figures_are_not_what_they_claim(
    tmp_path, capsys, change, message
):
    doc = {**run_result(1, small_record()).to_json(), **change}
    finished(tmp_path, json.dumps([doc]))
    assert cli.main(["impact", str(tmp_path), *TINY_ARGS]) == 2  # tiny: were it trained on
    err = capsys.readouterr().err
    assert message in err and "run 1" in err and len(err.strip().splitlines()) == 1, err


def test_a_step_of_the_wrong_shape_is_named_by_its_place(tmp_path, capsys):
    doc = run_result(1, small_record()).to_json()
    doc["steps"][2]["allreduce_s"] = [1.0, "x"]
    finished(tmp_path, json.dumps([doc]))
    assert cli.main(["impact", str(tmp_path), *TINY_ARGS]) == 2
    assert "run 1.steps[2].allreduce_s[1]: expected a number" in capsys.readouterr().err
