"""The loss record: each lost range lands in the right place of the ring schedule, bad records are refused."""

import copy

import pytest

from runs.collect import CollectError, loss_record
from workload.lossrecord import (
    ALL_GATHER,
    FORGIVEN,
    REDUCE_SCATTER,
    SHED,
    Layout,
    LossRecord,
    LossRecordError,
    StepClass,
    assemble,
    entry_from_completion,
)
from workload.plan import (
    TrainingConfig,
    chunk_sizes,
    compute_messages,
    gradient_messages,
    plan_step,
    ring_chunk,
)

N = 4
GRAD = 4 * 4096 * 10 + 3  # chunks of unequal size


def cfg(rank=0):
    return TrainingConfig(
        ranks=tuple(f"10.0.0.{i + 1}" for i in range(N)), rank=rank, steps=5, grad_bytes=GRAD
    )


def done(step, forgiven=(), shed=False):
    event = {"event": "recv_done", "step": step, "shed": shed}
    if forgiven:
        event["forgiven_ranges"] = [list(r) for r in forgiven]
    return event


def test_every_ring_hop_is_placed_by_phase_step_and_chunk():
    sizes = chunk_sizes(GRAD, N)
    for src in range(N):
        for msg in gradient_messages(cfg(), 3, src):
            entry = entry_from_completion(cfg(), msg, done(3, [(4096, 8192), (12288, 12300)]))
            j = msg.phase
            assert (entry.src, entry.dst, entry.step) == (src, (src + 1) % N, 3)
            assert entry.phase == (REDUCE_SCATTER if j < N - 1 else ALL_GATHER)
            assert entry.ring_step == j % (N - 1)
            assert entry.chunk == ring_chunk(src, j, N) and sizes[entry.chunk] == msg.size
            assert entry.ranges == ((4096, 8192, FORGIVEN), (12288, 12300, FORGIVEN))
            assert entry.lost_bytes == 4096 + 12


def test_a_shed_message_is_lost_whole_and_lossless_or_foreign_flows_write_nothing():
    msg = gradient_messages(cfg(), 2, 1)[4]
    assert entry_from_completion(cfg(), msg, done(2, shed=True)).ranges == ((0, msg.size, SHED),)
    assert entry_from_completion(cfg(), msg, done(2)) is None
    tp = compute_messages(cfg(), 2, 1)[0]
    assert entry_from_completion(cfg(), tp, done(2, [(0, 10)])) is None
    assert entry_from_completion(cfg(), None, done(2, [(0, 10)])) is None


def test_layout_follows_the_plan():
    layout = Layout.of(cfg())
    assert layout.ring == [0, 1, 2, 3]
    assert [size for _, size in layout.chunks] == chunk_sizes(GRAD, N)
    assert layout.step_bytes() == sum(
        plan_step(cfg(r), 1).expected_gradient_bytes for r in range(N)
    )
    assert Layout.from_json(layout.to_json()) == layout


def record():
    msgs = gradient_messages(cfg(), 2, 3)
    entries = [
        entry_from_completion(cfg(), msgs[0], done(2, [(0, 4096)])),
        entry_from_completion(cfg(), msgs[5], done(2, shed=True)),
    ]
    steps = [
        StepClass(s, s in (1, 2, 3, 5), 0.005 if s in (1, 2, 3, 5) else 0.1) for s in range(1, 6)
    ]
    return LossRecord(Layout.of(cfg()), steps, entries, "test")


def test_record_round_trips_and_rates_add_up():
    rec = record()
    assert LossRecord.from_json(rec.to_json()) == rec
    lost = 4096 + chunk_sizes(GRAD, N)[ring_chunk(3, 5, N)]
    assert rec.lost_bytes(2) == lost and rec.lost_bytes(1) == 0
    assert rec.step_rate(2) == pytest.approx(lost / (2 * (N - 1) * GRAD))


def _broken(change):
    doc = record().to_json()
    change(doc)
    return doc


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(schema="other/1"), "not a forgive-loss/1"),
        (lambda d: d["layout"].update(chunks=[[0, GRAD]]), "layout chunks"),
        (lambda d: d["steps"].pop(), "every step"),
        (lambda d: d["entries"][0].update(chunk=0), "sends chunk 3"),
        (lambda d: d["entries"][0].update(dst=2), "sends to 0"),
        (lambda d: d["entries"][0].update(phase="broadcast"), "unknown phase"),
        (lambda d: d["entries"][0].update(ranges=[[0, 10**6, "forgiven"]]), "outside chunk"),
        (
            lambda d: d["entries"][0].update(ranges=[[0, 10, "forgiven"], [5, 20, "forgiven"]]),
            "overlap",
        ),
        (lambda d: d["entries"][0].update(ranges=[[0, 10, "lost"]]), "unknown range state"),
        (lambda d: d["entries"].append(copy.deepcopy(d["entries"][0])), "two entries"),
        (lambda d: d["entries"][0].update(step=9), "step: 9"),
    ],
)
def test_bad_records_are_refused_with_one_line(change, message):
    with pytest.raises(LossRecordError, match=message):
        LossRecord.from_json(_broken(change))


def _train_lines(forgiven_at_rank0=4096):
    """Five steps of training records from every rank, as forgive-train writes them."""
    lines = {}
    for rank in range(N):
        recs = [{"type": "loss_layout", "rank": rank, **Layout.of(cfg()).to_json()}]
        for step in range(1, 6):
            lost = forgiven_at_rank0 if (rank, step) == (0, 2) else 0
            recs.append({"type": "train_step", "rank": rank, "step": step, "critical": step == 1,
                         "p": 0.005 if step == 1 else 0.1, "grad_forgiven": lost, "grad_shed": 0})  # fmt: skip
        lines[f"h{rank + 1}"] = recs
    msg = gradient_messages(cfg(), 2, 3)[1]  # rank 3 sends to rank 0
    entry = entry_from_completion(cfg(), msg, done(2, [(8192, 12288)]))
    lines["h1"].append({"type": "loss", "rank": 0, **entry.to_json()})
    return lines


def test_collect_assembles_the_record_and_checks_it_against_the_step_totals():
    rec = loss_record(_train_lines())
    assert rec.engine == "mininet" and len(rec.entries) == 1 and rec.lost_bytes(2) == 4096
    assert [s.critical for s in rec.steps] == [True, False, False, False, False]
    with pytest.raises(
        CollectError, match="rank 0 step 2 lists 4096 bytes lost, its step record 100"
    ):
        loss_record(_train_lines(forgiven_at_rank0=100))


def test_ranks_that_disagree_on_the_layout_are_refused():
    lines = _train_lines()
    lines["h2"][0]["grad_bytes"] = GRAD + 1
    with pytest.raises(CollectError, match="different loss layouts"):
        loss_record(lines)
    with pytest.raises(LossRecordError, match="no rank"):
        assemble([], [], [], "x")
