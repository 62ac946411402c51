"""Four hosts (endpoint and training rank) through the switch model in virtual time: no sockets,
no root. The same state machines `forgive-train` drives over raw sockets."""

from __future__ import annotations

import json

import pytest

from host_agent.endpoint import EndpointConfig
from host_agent.host import HostConfig
from host_agent.policies import parse_policy
from runs.collect import loss_record
from simulator.engine import star, train
from workload.lossrecord import Layout, LossRecord
from workload.plan import TrainingConfig, flow_step

STEPS = 20
JOB = TrainingConfig(
    ranks=("", "", "", ""),
    rank=0,
    steps=STEPS,
    grad_bytes=256 << 10,
    compute_s=0.5e-3,
    tp_bytes=32 << 10,
    pp_bytes=16 << 10,
    seed=3,
)


def run(policy: str = "forgive", seed: int = 3):
    host = HostConfig(endpoint=EndpointConfig(policy=parse_policy(policy), rto=1e-3, rto_max=0.02))
    job = TrainingConfig(**{**JOB.__dict__, "seed": seed})
    sim, ranks, outs = train(job, star(hosts=4), host)
    records = [[json.loads(line) for line in out.getvalue().splitlines()] for out in outs]
    return sim, ranks, outs, records


@pytest.fixture(scope="module")
def forgive_run():
    return run()


def test_training_forgives_within_the_bound_and_delivers_every_other_byte(forgive_run):
    sim, ranks, _, records = forgive_run
    assert all(r.finished and r.failure is None and not r.failed for r in ranks)
    totals = sim.switch_totals()["s1"]
    assert totals["trims"] > 0 and totals["ce_marks"] > 0
    steps = [rec for recs in records for rec in recs if rec["type"] == "train_step"]
    assert len(steps) == 4 * STEPS
    assert not [rec for recs in records for rec in recs if rec["type"] == "content_error"]
    critical = [s["critical"] for s in steps if s["rank"] == 0]
    assert critical == [step in (1, 2, 3, STEPS) for step in range(1, STEPS + 1)]
    for s in steps:
        assert s["bound_held"] and s["grad_forgiven"] <= s["grad_budget"]
        assert s["grad_received"] + s["grad_forgiven"] == s["grad_expected"]
        assert s["grad_forgiven"] * (1 - s["p"]) <= s["p"] * s["grad_received"]
    assert sum(s["grad_forgiven"] for s in steps if not s["critical"]) > 0
    assert sum(s["grad_retransmitted"] for s in steps) > 0, "trimmed non-gradients are resent"
    final = [rec for recs in records for rec in recs if rec["type"] == "train_done"]
    assert len(final) == 4 and all(f["bound_violations"] == f["content_errors"] == 0 for f in final)
    for host in sim.hosts:
        summary = host.endpoint.summary()
        assert summary.get("bound_violations", 0) == 0
        assert summary["core_rx"]["trimmed"] > 0
    assert sim.warnings == []


def test_the_same_seed_gives_byte_identical_records(forgive_run):
    sim, _, outs, _ = forgive_run
    again, _, outs_again, _ = run()
    assert [o.getvalue() for o in outs] == [o.getvalue() for o in outs_again]
    assert [log.getvalue() for log in sim.logs] == [log.getvalue() for log in again.logs]
    assert sim.now == again.now


def test_shedding_ends_agree_in_virtual_time():
    _, ranks, _, records = run("loose", seed=5)
    assert all(r.finished and not r.failed for r in ranks)
    final = [rec for recs in records for rec in recs if rec["type"] == "train_done"]
    shed_received = sum(f["grad_shed"] for f in final)
    assert shed_received == sum(f["grad_shed_sent"] for f in final) > 0
    assert all(f["grad_forgiven"] == 0 for f in final)


def test_trim_profile_and_exemption_records(forgive_run):
    """Every forgiven byte shows in its step's fifths; time obeying again only after toggles."""
    sim, _, _, records = forgive_run
    steps = [rec for recs in records for rec in recs if rec["type"] == "train_step"]
    for s in steps:
        fifths = s["trim_fifths"]
        assert len(fifths) == 5
        assert sum(f[2] for f in fifths) == s["grad_forgiven"]
        assert all(0 <= f[2] <= f[1] <= f[0] for f in fifths)
    assert sum(f[0] for s in steps for f in s["trim_fifths"]) > 0
    for s in steps:  # every forgiveness happens while the all-reduce runs
        assert sum(f[2] for f in s["allreduce_trim_fifths"]) == s["grad_forgiven"]
    by_rank = {}
    for s in steps:
        by_rank.setdefault(s["rank"], []).append(s["ended"])
    assert all(ends == sorted(ends) for ends in by_rank.values())
    stats = [json.loads(line) for log in sim.logs for line in log.getvalue().splitlines()]
    sends = [r for r in stats if r["type"] == "flow_send"]
    assert all(r["obeying_again_time"] == 0 for r in sends if r["mode_changes"] < 2)
    assert all(r["obeying_again_time"] >= 0 for r in sends)
    recvs = [r for r in stats if r["type"] == "flow_recv"]
    assert sum(r["trimmed_bytes"] for r in recvs) > 0
    assert all(r["trimmed_bytes"] >= 0 for r in recvs)


def test_virtual_time_writes_the_same_loss_record(forgive_run):
    _, _, _, records = forgive_run
    record = loss_record({f"h{i + 1}": recs for i, recs in enumerate(records)})
    steps = [rec for recs in records for rec in recs if rec["type"] == "train_step"]
    assert record.layout == Layout.of(JOB) and record.entries
    assert sum(e.lost_bytes for e in record.entries) == sum(s["grad_forgiven"] for s in steps)
    assert {r[2] for e in record.entries for r in e.ranges} == {"forgiven"}
    assert LossRecord.from_json(record.to_json()) == record
    _, _, _, shed = run("loose", seed=5)
    shed_record = loss_record({f"h{i + 1}": recs for i, recs in enumerate(shed)})
    assert {r for e in shed_record.entries for r in e.ranges} == {
        (0, Layout.of(JOB).chunks[e.chunk][1], "shed") for e in shed_record.entries
    }


def test_tensor_parallel_traffic_may_overlap_the_all_reduce():
    """tp_phase 'overlap': the all-reduce starts with the step, beside the TP and PP traffic,
    and the barrier still waits for the compute phase; every byte still arrives."""
    host = HostConfig(endpoint=EndpointConfig(policy=parse_policy("tight"), rto=1e-3, rto_max=0.02))
    timings = {}
    for phase in ("own", "overlap"):
        job = TrainingConfig(**{**JOB.__dict__, "steps": 4, "tp_phase": phase})
        _, ranks, outs = train(job, star(hosts=4), host)
        assert all(r.finished and not r.failed for r in ranks)
        steps = [
            rec
            for out in outs
            for rec in map(json.loads, out.getvalue().splitlines())
            if rec["type"] == "train_step"
        ]
        assert all(s["step_time"] >= JOB.compute_s * (1 - 1e-9) for s in steps), [
            s["step_time"] for s in steps
        ]
        timings[phase] = steps
    assert all(s["compute_time"] == 0 for s in timings["overlap"])
    assert all(s["compute_time"] >= JOB.compute_s * (1 - 1e-9) for s in timings["own"])
    with pytest.raises(ValueError, match="tp_phase must be one of own, overlap, got 'after'"):
        TrainingConfig(
            **{**JOB.__dict__, "ranks": ("10.0.0.1", "10.0.0.2"), "tp_phase": "after"}
        ).validate()


def test_a_rank_holds_its_last_step_only_however_many_it_runs(forgive_run):
    """A rank forgets a step once the next one has finished, so its memory is flat over a
    long run (the soak had seen every trainer grow some 20 KiB a step): after 20 steps it
    holds the plan, messages and completions of step 20 alone, and still every burst,
    which the run's end waits for."""
    _, ranks, _, records = forgive_run
    for rank in ranks:
        assert rank.finished and not rank.failed
        assert sorted(rank.plans) == [STEPS]
        held = {flow_step(f) for f in (*rank.messages, *rank.received, *rank.sent)}
        bursts = {flow_step(m.flow) for m in rank.bursts}
        assert held <= {STEPS} | bursts
        flows = {flow_step(x) for kind, x in rank.settled if kind in ("recv", "send")}
        steps = {x for kind, x in rank.settled if kind not in ("recv", "send")}
        assert flows <= {STEPS} | bursts and steps <= {STEPS}, rank.settled
    assert all(r[-1]["type"] == "train_done" for r in records)
