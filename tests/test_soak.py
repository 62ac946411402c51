"""The soak (topologies.soak): its bounds on made-up traces, and the soak itself, which is
long and runs only under `make soak` (a marked test: `make test`'s five minutes cannot hold
it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from netns import netns_unavailable

from topologies.soak import FD_GROWTH_BOUND, RSS_GROWTH_BOUND_KIB, Trace, judge, soak

STEPS = 40


def trace(rss=lambda s: 50_000, fds=lambda s: 10) -> Trace:
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


SOAK_STEPS = int(os.environ.get("FORGIVE_SOAK_STEPS", "50"))
SOAK_OUT = os.environ.get("FORGIVE_SOAK_OUT")


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
    assert verdict.held, verdict.failures
    assert doc["samples"] >= SOAK_STEPS
