"""The workload's schedule: every rank must derive the same flows for its peers."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.wire import PACKET_BYTES
from workload.plan import (
    CONTENT_POOL_BYTES,
    Kind,
    Message,
    TrainingConfig,
    chunk_bounds,
    chunk_owner,
    flow_id,
    gradient_messages,
    kind_of,
    message_bytes,
    plan_step,
    ring_chunk,
    synthetic_norms,
)
from workload.rank import classify, make_detector


def config(n, rank=0, **kw):
    kw.setdefault("ranks", tuple(f"10.0.0.{i + 1}" for i in range(n)))
    return TrainingConfig(rank=rank, **kw)


@settings(deadline=None)
@given(n=st.integers(2, 16), phase_rank=st.data())
def test_ring_forwards_what_it_received(n, phase_rank):
    rank = phase_rank.draw(st.integers(0, n - 1))
    phase = phase_rank.draw(st.integers(1, 2 * (n - 1) - 1))
    assert ring_chunk(rank, phase, n) == ring_chunk((rank - 1) % n, phase - 1, n)


@settings(deadline=None)
@given(n=st.integers(2, 16))
def test_ring_reduces_every_chunk_and_gathers_it_everywhere(n):
    # after reduce-scatter rank r holds the full chunk (r + 1) % n; all-gather sends it round
    for rank in range(n):
        assert ring_chunk(rank, n - 1, n) == (rank + 1) % n
        assert chunk_owner((rank + 1) % n, n) == rank
        gathered = {ring_chunk((rank - 1) % n, j, n) for j in range(n - 1, 2 * (n - 1))}
        assert gathered | {(rank + 1) % n} == set(range(n))


def test_sends_match_peer_registrations():
    n = 4
    for step in (0, 1, 7):
        sent = {}
        for rank in range(n):
            plan = plan_step(config(n, rank, burst_step=7, burst_src=2, burst_dst=0), step)
            sends = plan.compute_sends + plan.gradient_sends + plan.barrier_sends + plan.burst_sends
            for m in sends:
                assert m.src == rank
                sent[m.flow] = m
        for rank in range(n):
            plan = plan_step(config(n, rank, burst_step=7, burst_src=2, burst_dst=0), step)
            for m in plan.registrations():
                assert sent.pop(m.flow) == m
        assert not sent


def test_flow_ids_name_their_kind():
    for kind in Kind:
        assert kind_of(flow_id(4095, kind, 127, 1023)) == kind


def test_flow_ids_are_unique_across_steps_and_kinds():
    ids = set()
    for step in range(1, 21):
        for src in range(8):
            for m in gradient_messages(config(8), step, src):
                ids.add(m.flow)
            ids.add(flow_id(step, Kind.BARRIER, src, 3))
    assert len(ids) == 20 * 8 * (14 + 1)


def test_expected_gradient_bytes_is_two_rounds_of_chunks():
    plan = plan_step(config(4, 1, grad_bytes=1000), 1)
    assert plan.expected_gradient_bytes == 6 * 250


@pytest.mark.parametrize(
    "kw",
    [
        {"steps": 0},
        {"grad_bytes": 1},
        {"detector": "oracle"},
        {"burst_step": 99},
        {"burst_step": 1, "burst_src": 1, "burst_dst": 1},
        {"compute_s": -1.0},
        {"ranks": ("10.0.0.1", "10.0.0.1", "10.0.0.3")},
        {"ranks": ("10.0.0.1", "host-b", "10.0.0.3")},
    ],
)
def test_bad_training_configs_are_rejected(kw):
    with pytest.raises(ValueError):
        config(3, **kw).validate()


@pytest.mark.parametrize("detector", ["static", "accordion"])
def test_detectors_mark_early_and_final_steps_critical(detector):
    cfg = config(4, steps=20, detector=detector)
    det = make_detector(cfg)
    norms = synthetic_norms(cfg)
    critical = {step for step in range(1, 21) if classify(det, norms, step)}
    assert {1, 2, 3, 20} <= critical
    assert not critical & set(range(6, 18))


@settings(deadline=None)
@given(total=st.integers(16, 10**7), n=st.integers(2, 16))
def test_chunk_bounds_tile_the_buffer(total, n):
    bounds = chunk_bounds(total, n)
    assert bounds[0][0] == 0 and sum(size for _, size in bounds) == total
    for (off, size), (nxt, _) in itertools.pairwise(bounds):
        assert off + size == nxt


def test_tensor_parallel_groups_all_to_all_within_themselves():
    from workload.plan import Kind, compute_messages

    cfg = TrainingConfig(
        ranks=tuple(f"10.0.0.{i + 1}" for i in range(16)), rank=0, tp_group=8, pp_bytes=0
    )
    sends = {src: compute_messages(cfg, 1, src) for src in range(16)}
    for src, msgs in sends.items():
        group = range(src - src % 8, src - src % 8 + 8)
        assert sorted(m.dst for m in msgs) == [r for r in group if r != src]
        assert all(m.kind == Kind.TENSOR_PARALLEL and m.size == cfg.tp_bytes for m in msgs)
    for dst in range(16):
        senders = [m.src for msgs in sends.values() for m in msgs if m.dst == dst]
        assert len(senders) == 7, "seven senders converge on every receiving rank"
    flows = [m.flow for msgs in sends.values() for m in msgs]
    assert len(set(flows)) == len(flows)
    pair = TrainingConfig(ranks=cfg.ranks, rank=0)
    assert next((m.src, m.dst) for m in compute_messages(pair, 1, 5)) == (5, 4)


def test_message_content_is_the_seeds_own_and_no_packet_repeats_another():
    cfg = config(2, seed=3)
    msg = Message(flow_id(1, Kind.GRADIENT, 0, 0), 0, 1, 3 * CONTENT_POOL_BYTES + 5, Kind.GRADIENT)
    content = message_bytes(cfg, msg)
    assert len(content) == msg.size and content == message_bytes(cfg, msg)
    # Past the pool's end it wraps around, yet no packet of the message (each PACKET_BYTES
    # long) carries the bytes of another, so a packet put at the wrong offset shows.
    packets = [content[lo : lo + PACKET_BYTES] for lo in range(0, msg.size, PACKET_BYTES)]
    assert len(set(packets)) == len(packets)
    other = Message(flow_id(1, Kind.GRADIENT, 1, 0), 1, 0, 64, Kind.GRADIENT)
    assert message_bytes(cfg, other) != content[:64]
    assert message_bytes(config(2, seed=4), msg)[:64] != content[:64]
    assert message_bytes(cfg, Message(msg.flow, 0, 1, 0, Kind.GRADIENT)) == b""


@settings(deadline=None, max_examples=60)
@given(
    n=st.integers(2, 12),
    group=st.integers(1, 6),
    tp=st.sampled_from([0, 3000]),
    pp=st.sampled_from([0, 2000]),
    burst=st.tuples(st.integers(0, 11), st.integers(0, 11)),
    step=st.integers(0, 3),
    data=st.data(),
)
def test_a_receivers_plan_is_its_peers_sends_to_it_in_peer_order(
    n, group, tp, pp, burst, step, data
):
    # plan_step asks each peer only for its messages to this rank (`to=`), so that a rank's
    # plan costs a message per peer; it must be what filtering every peer's sends gives.
    from workload.plan import barrier_messages, burst_messages, compute_messages

    src, dst = burst[0] % n, burst[1] % n
    burst_kw = dict(burst_step=2, burst_src=src, burst_dst=dst, burst_bytes=5000)
    me = data.draw(st.integers(0, n - 1))
    cfg = config(
        n, me, tp_group=group, tp_bytes=tp, pp_bytes=pp, **(burst_kw if src != dst else {})
    )
    plan = plan_step(cfg, step)
    peers = [r for r in range(n) if r != me]

    def to_me(make):
        return [m for r in peers for m in make(cfg, step, r) if m.dst == me]

    assert plan.barrier_recvs == to_me(barrier_messages)
    if step:
        assert plan.compute_recvs == to_me(compute_messages)
        assert plan.burst_recvs == to_me(burst_messages)


def test_a_gradients_forgiven_bytes_are_told_from_corrupted_ones():
    # The rank checks a delivered chunk against the sender's content: zero-filled (forgiven)
    # bytes count as differing but not as corruption.
    from workload.rank import gradient_mismatch

    msg = Message(flow_id(1, Kind.GRADIENT, 0, 0), 0, 1, 3 * PACKET_BYTES, Kind.GRADIENT)
    expected = bytes(message_bytes(config(2), msg))
    forgiven = bytearray(expected)
    forgiven[PACKET_BYTES : 2 * PACKET_BYTES] = bytes(PACKET_BYTES)
    nonzero_in_gap = PACKET_BYTES - expected[PACKET_BYTES : 2 * PACKET_BYTES].count(0)
    assert gradient_mismatch(expected, expected) == (0, 0)
    assert gradient_mismatch(bytes(forgiven), expected) == (nonzero_in_gap, 0)
    forgiven[5] ^= 0xFF
    assert gradient_mismatch(bytes(forgiven), expected) == (nonzero_in_gap + 1, 1)
