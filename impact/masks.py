"""Which bytes each ring hop loses on each step, for the recorded loss and the shapes it is compared with.

A step's loss is a map from a ring hop, (phase index, sending rank), to the
[lo, hi) byte ranges of its chunk that the receiving rank goes without, in the
run's byte offsets. The comparisons differ only in how those ranges are chosen:

- `recorded`: the ranges the run's receivers forgave (or the messages shed);
- `uniform`: every packet of every hop lost independently, at the recorded
  step's rate;
- `uniform-P_high`: the same at P_high on every step (the loose baseline);
- `shed`: whole messages dropped by the emulation's shedding draw (DBLP-style)
  at the recorded step's rate.
"""

from __future__ import annotations

import random

from host_agent.policies import P_HIGH, shed_draw
from workload.lossrecord import Layout, LossRecord
from workload.plan import Kind, flow_id

StepLoss = dict[tuple[int, int], list[tuple[int, int]]]
"""(phase index, sending rank) -> lost [lo, hi) byte ranges of the chunk sent, in the run's bytes."""

NO_LOSS = "no-loss"
RECORDED = "recorded"
UNIFORM = "uniform"
UNIFORM_P_HIGH = "uniform-P_high"
SHED = "shed"
COMPARISONS = (NO_LOSS, RECORDED, UNIFORM, UNIFORM_P_HIGH, SHED)


def recorded(record: LossRecord) -> dict[int, StepLoss]:
    out: dict[int, StepLoss] = {s: {} for s in range(1, record.layout.steps + 1)}
    layout = record.layout
    for entry in record.entries:
        hop = (layout.phase_index(entry.phase, entry.ring_step), entry.src)
        out[entry.step].setdefault(hop, []).extend((lo, hi) for lo, hi, _ in entry.ranges)
    return out


def _hops(layout: Layout):
    for j in range(layout.phases):
        for src in range(layout.ranks):
            yield j, src, layout.chunks[layout.chunk(src, j)][1]


def uniform_packets(layout: Layout, step: int, rate: float, key: str) -> StepLoss:
    """Each packet of each hop lost with probability `rate`, independently; adjacent losses merge."""
    out: StepLoss = {}
    if rate <= 0:
        return out
    for j, src, size in _hops(layout):
        rng = random.Random(f"{key}:{step}:{j}:{src}")
        ranges: list[tuple[int, int]] = []
        for lo in range(0, size, layout.packet_bytes):
            if rng.random() < rate:
                hi = min(lo + layout.packet_bytes, size)
                if ranges and ranges[-1][1] == lo:
                    ranges[-1] = (ranges[-1][0], hi)
                else:
                    ranges.append((lo, hi))
        if ranges:
            out[j, src] = ranges
    return out


def shed_messages(layout: Layout, step: int, rate: float, seed: int) -> StepLoss:
    """Whole messages dropped where the emulation's shedding draw for the flow falls below `rate`."""
    return {
        (j, src): [(0, size)]
        for j, src, size in _hops(layout)
        if shed_draw(seed, step, flow_id(step, Kind.GRADIENT, src, j)) < rate
    }


def comparison_loss(name: str, record: LossRecord, seed: int) -> dict[int, StepLoss]:
    """Every step's loss for comparison `name`; draws depend on the seed and the comparison only."""
    layout = record.layout
    steps = range(1, layout.steps + 1)
    if name == NO_LOSS:
        return {s: {} for s in steps}
    if name == RECORDED:
        return recorded(record)
    if name == UNIFORM:
        return {s: uniform_packets(layout, s, record.step_rate(s), f"{seed}:{name}") for s in steps}
    if name == UNIFORM_P_HIGH:
        return {s: uniform_packets(layout, s, P_HIGH, f"{seed}:{name}") for s in steps}
    if name == SHED:
        return {s: shed_messages(layout, s, record.step_rate(s), seed) for s in steps}
    raise ValueError(f"unknown comparison {name!r} (known: {', '.join(COMPARISONS)})")


def lost_bytes(loss: StepLoss) -> int:
    return sum(hi - lo for ranges in loss.values() for lo, hi in ranges)
