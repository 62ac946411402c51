"""The soak (soak_harness): its bounds on made-up traces, a short soak of a small job in
`make test`, and the 200-step soak of the default job, which runs only under `make soak` (a
marked test: `make test`'s five minutes cannot hold it)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from netns import netns_unavailable
from soak_harness import (
    BMV2_PACKET_BYTES,
    FD_GROWTH_BOUND,
    NATIVE_SLACK_KIB,
    PYTHON_SLACK_KIB,
    Trace,
    allowances,
    fresh_records,
    judge,
    label,
    queue_highs,
    queues_of,
    soak,
    trims_per_step,
    warmup_of,
)

from common.wire import DATA_FRAME_LEN, TRIMMED_FRAME_LEN
from runplan.fabric import plan, preset
from runplan.run import RunConfig, RunError, plan_run
from topologies.steps import StepProgress

STEPS = 40


def trace(rss=lambda s: 50_000, fds=lambda s: 10) -> Trace:
    """One process, sampled at every step."""
    t = Trace()
    for s in range(1, STEPS + 1):
        t.add(s, "switch leaf1", rss(s), fds(s))
    return t


def record(held=True, steps=STEPS) -> dict:
    return {"steps": [{"bound_held": held}] * steps, "bound_violations": 0}


ALLOWED = {"switch leaf1": 1024}
"""The tests' allowance: 1 MiB over the warm-up's end value."""


def test_a_flat_run_holds_and_a_leak_or_a_failure_does_not():
    assert judge(trace(), STEPS, record(), 0, ALLOWED).held
    warm = trace(rss=lambda s: 20_000 + 1000 * min(s, 4), fds=lambda s: 5 + min(s, 4))
    assert judge(warm, STEPS, record(), 0, ALLOWED).held  # growth within the warm-up is not judged
    # warm-up 5 steps, its end steps 4 and 5: 300 KiB a step is 10500 KiB more at step 40
    assert warmup_of(STEPS) == (5, 4)
    leak = judge(trace(rss=lambda s: 50_000 + 300 * s), STEPS, record(), 0, ALLOWED)
    assert leak.failures == [
        "switch leaf1: RSS 62000 KiB at step 40, 10500 KiB over its 51500 KiB at the end of "
        "warm-up (steps 4-5); allowed 1024 KiB"
    ]
    assert judge(trace(rss=lambda s: 50_000 + 20 * s), STEPS, record(), 0, ALLOWED).held
    # without an allowance a process may not rise at all
    assert not judge(trace(rss=lambda s: 50_000 + 20 * s), STEPS, record(), 0).held
    # descriptors: the floors of steps 6..9 and 37..40
    fd_leak = judge(trace(fds=lambda s: 10 + s // 10), STEPS, record(), 0, ALLOWED)
    assert fd_leak.failures == ["switch leaf1: 3 more descriptors after warm-up"]
    assert FD_GROWTH_BOUND < 3
    transient = trace(fds=lambda s: 11 if s % 3 else 10)
    assert judge(transient, STEPS, record(), 0, ALLOWED).held
    assert judge(trace(), STEPS, record(held=False), 0, ALLOWED).failures == [
        "the loss bound did not hold on every step"
    ]
    assert "the run failed (exit status 1)" in judge(trace(), STEPS, None, 1, ALLOWED).failures
    short = judge(trace(), STEPS, record(steps=30), 0, ALLOWED)
    assert short.failures == [f"30 of {STEPS} steps recorded"]
    # a run too short for the sampler to see any process proves nothing
    assert judge(Trace(), STEPS, record(), 0, ALLOWED).failures == ["no process was sampled"]
    # nor does one whose steps went by between two samples
    gaps = trace()
    gaps.steps -= {7, 8}
    assert judge(gaps, STEPS, record(), 0, ALLOWED).failures == [
        f"2 of {STEPS} steps without a sample"
    ]


def test_a_rise_mid_run_that_then_stays_flat_fails():
    """What the first bound (the largest sample of the second half after warm-up against
    the first's) let through: spine1's 16.5 MiB at step 56 of BMv2's 200-step soak, flat
    after. Scaled to 40 steps: 16.5 MiB at step 12, flat to the end."""
    jump = trace(rss=lambda s: 44_000 + (16_900 if s >= 12 else 0))
    early, late = (
        [v for s, v in jump.rss_kib["switch leaf1"].items() if 5 < s <= 22],
        [v for s, v in jump.rss_kib["switch leaf1"].items() if s > 22],
    )
    assert max(late) == max(early)  # the halves see no growth
    assert judge(jump, STEPS, record(), 0, ALLOWED).failures == [
        "switch leaf1: RSS 60900 KiB at step 12, 16900 KiB over its 44000 KiB at the end of "
        "warm-up (steps 4-5); allowed 1024 KiB"
    ]
    # so does a rise that comes back down: no sample may exceed the bound
    spike = trace(rss=lambda s: 44_000 + (16_900 if s == 30 else 0))
    assert spike.rss_kib["switch leaf1"][STEPS] == 44_000
    assert not judge(spike, STEPS, record(), 0, ALLOWED).held
    # and one within the allowance holds
    assert judge(
        trace(rss=lambda s: 44_000 + (900 if s >= 12 else 0)), STEPS, record(), 0, ALLOWED
    ).held


def test_the_warm_up_end_is_the_largest_of_its_last_steps():
    """A process whose largest sample per step swings with its garbage collector is judged
    against the top of the swing at the warm-up's end, not the trough it may be in."""
    swing = trace(rss=lambda s: 30_000 + (800 if s % 2 else 0))
    assert judge(swing, STEPS, record(), 0, {"switch leaf1": 0}).held
    assert warmup_of(200) == (20, 16)  # the soak's: the last 5 steps of 20


def test_allowances_are_the_queues_the_messages_and_the_timeline(tmp_path):
    queues = queues_of([])
    assert queues == {
        "data_queue_bytes": 65536,
        "low_queue_bytes": 131072,
        "high_queue_bytes": 65536,
    }
    low, high = 65536 // DATA_FRAME_LEN + 1, -(-65536 // TRIMMED_FRAME_LEN)  # 16 and 1130
    t = Trace()
    model = [sys.executable, "-m", "commands.switch", "--name", "leaf1", "--control", "c"]
    model += ["-i", "1=leaf1-eth1", "-i", "2=leaf1-eth2", "-i", "3=leaf1-eth3"]
    bmv2 = ["simple_switch_grpc", "--device-id", "2", "--no-p4", "-i", "1@spine1-eth1"]
    bmv2 += ["-i", "2@spine1-eth2", "--thrift-port", "9090", "--log-file", "x/spine1.bmv2.log"]
    entry = plan_run(RunConfig(preset("2to1")), tmp_path).hosts[0]
    trainer = [sys.executable, "-m", "commands.train", "--host", entry.to_json()]
    for argv in (model, bmv2, trainer, [sys.executable, "-m", "commands.forgive", "run"]):
        t.argv[label(0, argv)] = argv
    t.argv["shell h1"] = ["bash", "--norc", "-is", "mininet:h1"]
    timeline = [{"t": 0.5 * i, "trims": 10 * i, "ce_marks": i} for i in range(1, 101)]
    got = allowances(t, queues, {"timeline": timeline})
    assert set(got) == {"switch leaf1", "switch spine1", "trainer h1", "forgive run", "shell h1"}
    # the model: each frame a bytearray of its own length and a little more
    model_kib = got["switch leaf1"]["kib"] - PYTHON_SLACK_KIB
    bare = 3 * (low * DATA_FRAME_LEN + high * TRIMMED_FRAME_LEN) / 1024
    assert bare < model_kib < bare + 3 * (low + high) * 200 / 1024
    # BMv2: what it was measured to hold per packet queued, a frame or a trimmed header
    held = 2 * (low * BMV2_PACKET_BYTES["full"] + high * BMV2_PACKET_BYTES["header"])
    assert got["switch spine1"]["kib"] == NATIVE_SLACK_KIB - (-held // 1024)
    cfg = entry.training
    sent = 2 * (len(cfg.ranks) - 1) * (cfg.grad_bytes // len(cfg.ranks))  # the ring, each way
    assert got["trainer h1"]["kib"] >= PYTHON_SLACK_KIB + 2 * 2 * sent / 1024
    assert PYTHON_SLACK_KIB + 100 * 100 / 1024 < got["forgive run"]["kib"] < PYTHON_SLACK_KIB + 100
    assert got["shell h1"] == {"kib": NATIVE_SLACK_KIB, "why": f"{NATIVE_SLACK_KIB} KiB slack"}
    # the allowance grows with the queues it is worked out from
    bigger = allowances(t, queues_of(["--data-queue-kib", "16384"]), None)
    assert bigger["switch spine1"]["kib"] > got["switch spine1"]["kib"]


def test_the_soak_reads_the_queues_the_run_gives_its_switches():
    thresholds = plan(preset("2to1")).thresholds()
    assert queues_of([])["data_queue_bytes"] == thresholds.data_queue_bytes
    assert queues_of(["--data-queue-kib", "1100"])["data_queue_bytes"] == round(1100 * 1024 / 64)
    assert queues_of(SMALL_JOB) == queues_of(["--data-queue-kib", "1100"])


def test_the_sampler_reads_only_records_this_run_wrote(tmp_path):
    old, new = tmp_path / "h1.train.jsonl", tmp_path / "h2.train.jsonl"
    old.write_text('{"type": "train_step", "step": 200}\n')  # a longer run's, left behind
    since = time.time()
    os.utime(old, (since - 60, since - 60))
    new.write_text('{"type": "train_step", "step": 3}\n')
    assert fresh_records(tmp_path, since) == [new]


def test_progress_reads_what_was_appended_and_waits_for_every_rank(tmp_path):
    a, b = tmp_path / "h1.train.jsonl", tmp_path / "h2.train.jsonl"
    progress = StepProgress()
    assert progress.done([a, b]) == 0  # no record yet
    a.write_text('{"type": "loss_layout"}\n{"type": "train_step", "step": 1}\n')
    b.write_text('{"type": "train_step", "step": 1}\n{"type": "train_st')  # h2 mid-line
    assert progress.done([a, b]) == 1
    with open(a, "a") as f:
        f.write('{"type": "train_step", "step": 2}\n')
    assert progress.done([a, b]) == 1  # h2 has finished step 1 only
    with open(b, "a") as f:
        f.write('ep", "step": 2}\n')
    assert progress.done([a, b]) == 2
    b.write_text('{"type": "train_step", "step": 1}\n')  # h2's record begun again
    assert progress.done([a, b]) == 1
    with open(b, "a") as f:
        f.write("not json\n")
    with pytest.raises(RunError, match=r"h2\.train\.jsonl: line 1 after byte"):
        progress.done([a, b])


SOAK_STEPS = int(os.environ.get("FORGIVE_SOAK_STEPS", "50"))
SOAK_OUT = os.environ.get("FORGIVE_SOAK_OUT")


@pytest.mark.fabric
@pytest.mark.soak  # not netns: `pytest -m netns` must not pick up a 15-minute run
@pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))
@pytest.mark.parametrize("switch", ["model", "bmv2"])
def test_a_long_run_holds_memory_descriptors_and_the_loss_bound(switch, tmp_path):
    if switch == "bmv2" and shutil.which("simple_switch_grpc") is None:
        pytest.skip("bmv2: simple_switch_grpc not installed")
    out = Path(SOAK_OUT) / switch if SOAK_OUT else tmp_path
    timeout = 60 + 20 * SOAK_STEPS
    _, verdict, doc = soak(SOAK_STEPS, out, ["--switch", switch], timeout, tmp_path / "run")
    print((out / "table.txt").read_text())
    assert verdict.held, (verdict.failures, doc["stderr_tail"])


SHORT_SOAK_STEPS = 50
SMALL_JOB = ["--grad-mib", "4", "--tp-mib", "0.5", "--pp-mib", "0.125", "--compute-ms", "0.4"]
SMALL_JOB += ["--data-queue-kib", "1100"]
"""A job whose step lasts about 0.2 s on the switch model (the default job's: 3.5 s): a
64 KiB gradient per rank (fabric scale 4 MiB), 125 ms of compute (with 31 ms, steps of
0.12 s on a quiet machine could end inside one sampling pass and go unsampled), a data queue of
17.2 KiB (4 frames, the smallest the byte scale allows), so the ring still trims and the
ranks forgive within their budget."""


@pytest.mark.netns
@pytest.mark.fabric
@pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))
def test_a_short_soak_of_a_small_job_holds_its_bounds(tmp_path):
    """50 steps, each sampled (docs/soak.md has its cost)."""
    _, verdict, doc = soak(SHORT_SOAK_STEPS, tmp_path, SMALL_JOB, 300, tmp_path / "run")
    assert verdict.held, (verdict.failures, doc["stderr_tail"])
    assert doc["run"]["trims"] > 0  # the loss bound was held with losses to hold it against


def test_a_jump_in_a_switch_s_memory_is_set_against_its_queues_and_trims():
    """The evidence for a high-water mark: each RSS jump after warm-up, and whether the
    switch's queues or its trims in a step reached a new high at it (or the step before)."""
    t = trace(rss=lambda s: 44_000 + (16_900 if s >= 12 else 0) + (13_000 if s >= 30 else 0))
    for s in range(1, STEPS + 1):
        queues = (4154 * (3 if s == 11 else 1), 58 * (40 if s == 30 else 1))
        t.add_switch(s, "switch leaf1", queues, 1000 * s + (5000 if s >= 30 else 0))
    assert trims_per_step(t, "switch leaf1")[30] == 6000
    assert trims_per_step(t, "switch leaf1")[31] == 1000
    highs = queue_highs(t, judge(t, STEPS, record(), 0, ALLOWED))["switch leaf1"]
    assert highs["largest_queued_bytes"] == 3 * 4154 + 58
    assert highs["largest_trims_in_step"] == 6000
    assert [
        (j["step"], j["rise_kib"], j["queue_high"], j["trims_high"]) for j in highs["rss_jumps"]
    ] == [
        (12, 16_900, True, False),  # the queues' high at step 11, the trims flat
        (30, 13_000, True, True),
    ]
    # a jump with neither is growth as far as these figures go
    flat = trace(rss=lambda s: 44_000 + (16_900 if s >= 12 else 0))
    for s in range(1, STEPS + 1):
        flat.add_switch(s, "switch leaf1", (4154, 58), 1000 * s)
    (jump,) = queue_highs(flat, judge(flat, STEPS, record(), 0, ALLOWED))["switch leaf1"][
        "rss_jumps"
    ]
    assert (jump["step"], jump["queue_high"], jump["trims_high"]) == (12, False, False)
