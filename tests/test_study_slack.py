"""The all-reduce's line-rate bound, worked out by hand on the note's fabrics and the emulation's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from runplan.fabric import PRESETS
from runplan.run import JOBS, RunConfig
from study.slack import allreduce_bound_s, slack

RING_BITS = 2 * 63 / 64 * (64 << 20) * 8
"""What each of 64 ranks sends in a ring all-reduce of 64 MiB, in bits."""


def config(fabric: str, **kw) -> RunConfig:
    return RunConfig(PRESETS[fabric], workload=JOBS["note"], engine="sim", **kw)


def test_note_4to1_interleaved_shares_two_uplinks_among_eight_hosts():
    # every ring hop leaves its leaf: 8 flows on 2 x 400 Gbit/s, 100 Gbit/s each
    assert allreduce_bound_s(config("note-4to1")) == pytest.approx(RING_BITS / 100e9)
    assert allreduce_bound_s(config("note-4to1")) == pytest.approx(10.57e-3, rel=1e-3)


def test_without_oversubscription_or_packed_the_host_link_bounds_it():
    host_link = RING_BITS / 400e9
    assert allreduce_bound_s(config("note-1to1")) == pytest.approx(host_link)
    # packed: one hop per leaf crosses the uplinks, the other seven stay inside the leaf
    assert allreduce_bound_s(config("note-4to1", placement="packed")) == pytest.approx(host_link)


def test_the_emulations_2to1_and_a_companion_job():
    # 4 ranks on 2 leaves of 2 hosts, 1 spine: both hosts of a leaf leave it, 200 Gbit/s each
    two = RunConfig(PRESETS["2to1"])
    assert allreduce_bound_s(two) == pytest.approx(2 * 3 / 4 * (64 << 20) * 8 / 200e9)
    # a second job takes half the hosts: the first job's 32 ranks sit 4 to a leaf, all of
    # them crossing; alone on the uplinks they get 2 x 400 / 4 = 200 Gbit/s each (the bound
    # leaves the second job's traffic out, as it leaves out tensor-parallel traffic)
    both = config("note-4to1", companion="tight")
    bits = 2 * 31 / 32 * (64 << 20) * 8
    assert allreduce_bound_s(both) == pytest.approx(bits / 200e9)


def test_slack_is_the_measured_time_over_the_bound():
    c = config("note-4to1")
    assert slack(32.3e-3, c) == pytest.approx(3.06, abs=0.01)  # the note's tight
    assert slack(allreduce_bound_s(replace(c, seed=2)), c) == pytest.approx(1.0)
