"""The soak (topologies.soak): its bounds on made-up traces, a short soak of a small job in
`make test`, and the 200-step soak of the default job, which runs only under `make soak` (a
marked test: `make test`'s five minutes cannot hold it)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from netns import netns_unavailable

from topologies.collect import CollectError, StepProgress
from topologies.soak import FD_GROWTH_BOUND, RSS_GROWTH_BOUND_KIB, Trace, fresh_records, judge, soak

STEPS = 40


def trace(rss=lambda s: 50_000, fds=lambda s: 10) -> Trace:
    """One process, sampled at every step."""
    t = Trace()
    for s in range(1, STEPS + 1):
        t.add(s, "switch leaf1", rss(s), fds(s))
    return t


def record(held=True, steps=STEPS) -> dict:
    return {"steps": [{"bound_held": held}] * steps, "bound_violations": 0}


def test_a_flat_run_holds_and_a_leak_or_a_failure_does_not():
    assert judge(trace(), STEPS, record(), 0).held
    warm = trace(rss=lambda s: 20_000 + 1000 * min(s, 4), fds=lambda s: 5 + min(s, 4))
    assert judge(warm, STEPS, record(), 0).held  # growth within the warm-up is not judged
    # warm-up 5 steps, judged halves 6..22 and 23..40: 300 KiB a step is 5400 over 18 steps
    leak = judge(trace(rss=lambda s: 50_000 + 300 * s), STEPS, record(), 0)
    assert leak.failures == ["switch leaf1: RSS grew 5400 KiB after warm-up"]
    assert RSS_GROWTH_BOUND_KIB < 5400
    assert judge(trace(rss=lambda s: 50_000 + 100 * s), STEPS, record(), 0).held
    # descriptors: the floors of steps 6..9 and 37..40
    fd_leak = judge(trace(fds=lambda s: 10 + s // 10), STEPS, record(), 0)
    assert fd_leak.failures == ["switch leaf1: 3 more descriptors after warm-up"]
    assert FD_GROWTH_BOUND < 3
    assert judge(trace(fds=lambda s: 11 if s % 3 else 10), STEPS, record(), 0).held  # transient
    assert judge(trace(), STEPS, record(held=False), 0).failures == [
        "the loss bound did not hold on every step"
    ]
    assert "the run failed (exit status 1)" in judge(trace(), STEPS, None, 1).failures
    assert judge(trace(), STEPS, record(steps=30), 0).failures == [f"30 of {STEPS} steps recorded"]
    # a run too short for the sampler to see any process proves nothing
    assert judge(Trace(), STEPS, record(), 0).failures == ["no process was sampled"]
    # nor does one whose steps went by between two samples
    gaps = trace()
    gaps.steps -= {7, 8}
    assert judge(gaps, STEPS, record(), 0).failures == [f"2 of {STEPS} steps without a sample"]


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
    with pytest.raises(CollectError, match=r"h2\.train\.jsonl: line 1 after byte"):
        progress.done([a, b])


SOAK_STEPS = int(os.environ.get("FORGIVE_SOAK_STEPS", "50"))
SOAK_OUT = os.environ.get("FORGIVE_SOAK_OUT")


@pytest.mark.fabric
@pytest.mark.soak  # only: `pytest -m netns` must not pick up a 15-minute run
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
SMALL_JOB = ["--grad-mib", "4", "--tp-mib", "0.5", "--pp-mib", "0.125", "--compute-ms", "0.1"]
SMALL_JOB += ["--data-queue-kib", "1100"]
"""A job whose step lasts about 0.12 s on the switch model (the default job's: 3.5 s): a
64 KiB gradient per rank (fabric scale 4 MiB), 31 ms of compute, and a data queue of
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
