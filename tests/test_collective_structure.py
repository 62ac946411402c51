"""The all-reduce's structure as ASTRA-sim runs it (parts, parts at once, completion by the
sender's last ACK), against answers worked out by hand on an idle fabric."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from common.wire import DATA_FRAME_LEN, PACKET_BYTES, TRIMMED_FRAME_LEN
from host_agent.endpoint import EndpointConfig
from host_agent.host import HostConfig
from host_agent.policies import parse_policy
from simulator.engine import star, train
from workload.lossrecord import entry_from_completion
from workload.plan import (
    Kind,
    TrainingConfig,
    chunk_bounds,
    gradient_messages,
    plan_step,
    ring_chunk,
)

HEADERS = DATA_FRAME_LEN - PACKET_BYTES
RATE = 10e9
DELAY = 2e-6
RANKS = tuple(f"10.0.0.{i}" for i in range(1, 5))
NO_MARKS = 1 << 30


def config(**kw) -> TrainingConfig:
    base = TrainingConfig(
        ranks=RANKS, rank=0, steps=1, grad_bytes=64 * PACKET_BYTES, compute_s=0.0, tp_bytes=0,
        pp_bytes=0, critical=(1,),
    )  # fmt: skip
    return replace(base, **kw)


def test_every_part_carries_its_piece_of_every_chunk_and_the_parts_add_up():
    cfg = config(grad_bytes=1_000_003, splits=4)
    n = len(RANKS)
    for src in range(n):
        msgs = gradient_messages(cfg, 2, src)
        assert len(msgs) == 4 * 2 * (n - 1)
        assert len({m.flow for m in msgs}) == len(msgs)
        for j in range(2 * (n - 1)):
            chunk = ring_chunk(src, j, n)
            pieces = sorted((m.offset, m.size) for m in msgs if m.phase == j)
            assert [m.split for m in msgs if m.phase == j] == [0, 1, 2, 3]
            # the pieces tile the chunk, in order
            assert pieces == chunk_bounds(chunk_bounds(cfg.grad_bytes, n)[chunk][1], 4)
    whole = sum(m.size for m in plan_step(config(grad_bytes=1_000_003), 1).gradient_recvs)
    split = sum(m.size for m in plan_step(cfg, 1).gradient_recvs)
    assert split == whole, "a rank receives the same gradient bytes however the ring is split"


def test_one_part_is_the_ring_it_always_was():
    cfg = config(grad_bytes=1_000_003)
    assert [(m.flow, m.size, m.phase, m.split, m.offset) for m in gradient_messages(cfg, 3, 1)] == [
        (m.flow, m.size, m.phase, 0, 0) for m in gradient_messages(replace(cfg, splits=1), 3, 1)
    ]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"splits": 0}, "splits must lie in 1..170"),
        ({"splits": 171}, "splits must lie in 1..170"),
        ({"splits": 2, "active_splits": 3}, "active_splits must lie in 1..splits (2)"),
        ({"grad_bytes": 7, "splits": 2}, "every ring chunk's piece"),
        ({"completion": "receiver-ack"}, "completion must be one of receiver, sender-ack"),
    ],
)
def test_a_bad_structure_is_refused_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(**changes).validate()


def test_a_forgiven_range_of_a_part_is_recorded_at_its_place_in_the_chunk():
    cfg = config(grad_bytes=64 * PACKET_BYTES, splits=4)
    msg = next(m for m in gradient_messages(cfg, 1, 1) if m.split == 2 and m.phase == 0)
    entry = entry_from_completion(
        cfg, msg, {"step": 1, "forgiven_ranges": [(0, 100)], "shed": False}
    )
    assert entry is not None and entry.split == 2
    assert entry.ranges == ((msg.offset, msg.offset + 100, "forgiven"),)
    assert entry.to_json()["split"] == 2
    whole = replace(msg, split=0, offset=0)
    assert (
        "split"
        not in entry_from_completion(
            cfg, whole, {"step": 1, "forgiven_ranges": [(0, 100)], "shed": False}
        ).to_json()
    ), "a ring that is not split records what it always did"


def allreduce_s(cfg: TrainingConfig) -> float:
    """The all-reduce's time at rank 0, on an idle star of four hosts at RATE."""
    host = HostConfig(
        endpoint=EndpointConfig(
            policy=parse_policy("dcqcn"), line_rate_bps=RATE, rto=1.0, rto_max=10.0, dcqcn="off"
        )
    )
    fabric = star(
        len(RANKS),
        port_rate_bps=int(RATE),
        data_queue_bytes=64 * DATA_FRAME_LEN,
        ecn_kmin=NO_MARKS,
        ecn_kmax=NO_MARKS,
        ecn_pmax=0,
    )
    sim, ranks, outs = train(cfg, fabric, host, delay_s=DELAY, limit_s=1.0)
    assert not any(r.failed for r in ranks)
    steps = [json.loads(line) for line in outs[0].getvalue().splitlines()]
    (record,) = [s for s in steps if s["type"] == "train_step"]
    assert sim.switch_totals()["s1"]["trims"] == 0
    return record["allreduce_time"]


def hop_s(message_bytes: int) -> float:
    """A message's last byte at the next rank, from its first byte's start, on an idle star:
    its wire bytes at the rate, its first frame stored and forwarded once more, two delays."""
    packets = -(-message_bytes // PACKET_BYTES)
    first = HEADERS + min(message_bytes, PACKET_BYTES)
    return (message_bytes + packets * HEADERS + first) * 8 / RATE + 2 * DELAY


@pytest.mark.parametrize("splits", [1, 4])
def test_a_ring_completed_by_the_senders_last_ack_waits_an_acks_trip_back_per_ring_step(splits):
    n = len(RANKS)
    cfg = config(splits=splits)
    piece = cfg.grad_bytes // n // splits
    steps = 2 * (n - 1) * splits
    own = allreduce_s(cfg)
    acked = allreduce_s(replace(cfg, completion="sender-ack"))
    # The last ACK's trip back: its frame through the receiver's NIC and the switch's port,
    # and the two links' delays.
    ack_trip = 2 * TRIMMED_FRAME_LEN * 8 / RATE + 2 * DELAY
    # Each ring step is one message's hop; the receiver forwards the next at once. A part is
    # done at a rank once its last message is received and its own last one acknowledged,
    # so the next part (or the all-reduce's end) comes an ACK's trip after the last receipt.
    assert own == pytest.approx(steps * hop_s(piece) + splits * ack_trip, rel=0.005)
    # Under sender-ack every ring step waits for that trip.
    assert acked == pytest.approx(steps * (hop_s(piece) + ack_trip), rel=0.005)
    # So the ring takes at least a round trip per step plus its bytes at the line rate.
    round_trip = 4 * DELAY
    line_rate = 2 * (n - 1) / n * cfg.grad_bytes * 8 / RATE
    assert acked >= steps * round_trip + line_rate


def test_parts_at_once_overlap_their_rings():
    one_at_a_time = allreduce_s(config(splits=4))
    two_at_once = allreduce_s(config(splits=4, active_splits=2))
    # Two rings share each link: their bytes take as long, their delays overlap.
    assert two_at_once < one_at_a_time
    line_rate = 2 * 3 / 4 * config().grad_bytes * 8 / RATE
    assert two_at_once > line_rate


def test_gradient_messages_are_the_only_ones_split():
    plan = plan_step(config(splits=4, tp_bytes=1000, tp_group=2, pp_bytes=1000), 1)
    assert all(m.split == 0 and m.offset == 0 for m in plan.compute_sends)
    assert {m.kind for m in plan.gradient_sends} == {Kind.GRADIENT}


@pytest.mark.parametrize("splits", [1, 4])
def test_a_reduce_scatter_message_is_reduced_before_the_ring_goes_on(splits):
    n = len(RANKS)
    rate = 2e9  # bytes/s: slow enough that the reduction is a sizeable share of a step
    cfg = config(splits=splits)
    piece = cfg.grad_bytes // n // splits
    plain = allreduce_s(cfg)
    reduced = allreduce_s(replace(cfg, reduce_bytes_per_s=rate))
    # n - 1 reduce-scatter messages per part are each held three passes over their bytes.
    assert reduced - plain == pytest.approx((n - 1) * splits * 3 * piece / rate, rel=0.01)


def test_the_reduction_rate_is_checked():
    with pytest.raises(ValueError, match="reduce_bytes_per_s must be a finite number >= 0"):
        config(reduce_bytes_per_s=-1.0).validate()


@pytest.mark.parametrize("completion", ["receiver", "sender-ack"])
def test_a_shed_message_settles_its_ring_step_under_either_completion(completion):
    """A shed gradient message has no last ACK: under 'sender-ack' its sender's shedding is what
    tells the receiver, or the ring waits for ever (a run of `shed` under astra-ns3 hung)."""
    host = HostConfig(
        endpoint=EndpointConfig(
            policy=parse_policy("loose"), line_rate_bps=RATE, rto=1.0, rto_max=10.0, dcqcn="off"
        )
    )
    fabric = star(
        len(RANKS), port_rate_bps=int(RATE), data_queue_bytes=64 * DATA_FRAME_LEN,
        ecn_kmin=NO_MARKS, ecn_kmax=NO_MARKS, ecn_pmax=0,
    )  # fmt: skip
    cfg = config(steps=4, critical=(1,), splits=2, completion=completion)
    _, ranks, outs = train(cfg, fabric, host, delay_s=DELAY, limit_s=1.0)
    assert all(r.trained and not r.failed for r in ranks)
    steps = [json.loads(line) for out in outs for line in out.getvalue().splitlines()]
    records = [s for s in steps if s["type"] == "train_step"]
    assert len(records) == 4 * len(RANKS)
    assert sum(s["grad_shed"] for s in records) > 0, "some messages were shed"
