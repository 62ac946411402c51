"""Delayed ACKs must tell the sender exactly what the core's every ACK would have."""

from helpers import data, trim
from hypothesis import given, settings
from hypothesis import strategies as st

from common.wire import Flag, Fth, Opcode, decode
from host_agent.acks import AckCoalescer
from host_agent.core import ForgiveReceiver, ReceiverPolicy

SEG = 1000


def acked(replies: list[bytes]) -> set[int]:
    """Segments a sender learns are settled from a stream of ACKs and NACKs."""
    out: set[int] = set()
    for raw in replies:
        fth, _ = decode(raw)
        if fth.opcode == Opcode.ACK:
            out |= set(range(0, fth.seq // SEG))
            out |= set(range(fth.aux // SEG, (fth.aux + fth.length) // SEG))
        elif fth.opcode == Opcode.NACK:
            out |= set(range(0, fth.aux // SEG))
    return out


@settings(max_examples=60, deadline=None)
@given(
    order=st.permutations(range(40)),
    trimmed=st.sets(st.integers(0, 39), max_size=6),
    every=st.integers(1, 20),
)
def test_coalesced_acks_carry_the_same_knowledge_in_order(order, trimmed, every):
    rx = ForgiveReceiver(ReceiverPolicy(p_low=0.0, p_high=0.0))
    rx.register_flow(1, step=0, gradient=False)
    total = 40 * SEG
    everything, sent = [], []
    coalescer = AckCoalescer(every=every, delay=1.0)
    packets = [trim(1, i * SEG, SEG, total) for i in sorted(trimmed)]
    packets += [data(1, i * SEG, SEG, total) for i in order]
    for now, pkt in enumerate(packets):
        for reply in rx.receive(pkt, False, float(now)):
            everything.append(reply)
            sent += [r for r, _ in coalescer.offer(reply, None, float(now), total)]
    sent += [r for r, _ in coalescer.due(1e9)]
    assert not coalescer.held
    assert acked(sent) == acked(everything) == set(range(40))
    assert sent[-1] == everything[-1], "the latest report must arrive last"
    nacks = [r for r in everything if decode(r)[0].opcode != Opcode.ACK]
    assert [r for r in sent if decode(r)[0].opcode != Opcode.ACK] == nacks
    assert len(sent) <= len(everything)


def test_acks_wait_at_most_the_delay_and_the_count():
    coalescer = AckCoalescer(every=4, delay=1e-3)
    rx = ForgiveReceiver(ReceiverPolicy(p_low=0.0, p_high=0.0))
    rx.register_flow(9, step=0, gradient=False)
    total = 100 * SEG
    released = []
    for i in range(3):
        (reply,) = rx.receive(data(9, i * SEG, SEG, total), False, 0.0)
        released += coalescer.offer(reply, "peer", 0.0, total)
    assert released == [] and coalescer.deadline() == 1e-3
    assert coalescer.due(0.5e-3) == []
    assert len(coalescer.due(1e-3)) == 1
    for i in range(3, 7):
        (reply,) = rx.receive(data(9, i * SEG, SEG, total), False, 2.0)
        released += coalescer.offer(reply, "peer", 2.0, total)
    assert len(released) == 1 and decode(released[0][0])[0].seq == 7 * SEG
    assert coalescer.coalesced == 2 + 3


def test_the_flows_last_ack_is_not_held():
    coalescer = AckCoalescer(every=100, delay=1.0)
    rx = ForgiveReceiver(ReceiverPolicy(p_low=0.0, p_high=0.0))
    rx.register_flow(3, step=0, gradient=False)
    (reply,) = rx.receive(data(3, 0, SEG, SEG), False, 0.0)
    assert coalescer.offer(reply, None, 0.0, SEG) == [(reply, None)]


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["ack", "ack", "ahead", "ece", "nack", "due", "forget"]),
            st.integers(1, 90),
            st.integers(0, 9),
            st.booleans(),
        ),
        max_size=400,
    )
)
def test_the_deadline_is_the_earliest_held_ack_plus_the_delay(steps):
    # The coalescer finds its deadline from a heap it cleans lazily, and rebuilds the heap
    # when a driver seldom asks; the deadline must be what a scan of every held ACK gives,
    # through ACKs held, coalesced, sent early (ECE, a NACK, an ACK behind the held one),
    # released and forgotten, and the heap must stay bounded by the ACKs held.
    coalescer = AckCoalescer(every=3, delay=1.0)
    total = 400 * SEG
    rcv_nxt = dict.fromkeys(range(1, 91), 0)
    now = 0.0
    for what, flow, dt, ask in steps:
        now += dt * 0.25
        lo = rcv_nxt[flow]
        if what in ("ack", "ece") and lo < total - 2 * SEG:
            rcv_nxt[flow] = lo + SEG
            flags = Flag.ECE if what == "ece" else 0
            reply = Fth(Opcode.ACK, flags, SEG, flow, lo + SEG, lo).encode()
            coalescer.offer(reply, "peer", now, total)
        elif what == "ahead" and lo < total - 2 * SEG:
            # a selective ACK past a gap: rcv_nxt stays, so a held ACK covering more is sent
            reply = Fth(Opcode.ACK, 0, SEG, flow, lo, lo + SEG).encode()
            coalescer.offer(reply, "peer", now, total)
        elif what == "nack" and lo < total - 2 * SEG:
            coalescer.offer(Fth(Opcode.NACK, 0, SEG, flow, lo, lo).encode(), "peer", now, total)
        elif what == "due":
            coalescer.due(now)
        elif what == "forget":
            coalescer.forget(flow)
        if ask:
            held = coalescer.held.values()
            expected = min(h.since for h in held) + 1.0 if held else None
            assert coalescer.deadline() == expected
        assert len(coalescer._since) <= 2 * len(coalescer.held) + 64 + 1
    held = coalescer.held.values()
    assert coalescer.deadline() == (min(h.since for h in held) + 1.0 if held else None)


def test_a_heap_of_stale_entries_is_rebuilt_from_the_acks_held():
    # A driver that never asks for the deadline leaves every released ACK's entry behind;
    # past twice the ACKs held (and a slack) the heap is rebuilt from what is held.
    coalescer = AckCoalescer(every=3, delay=1.0)
    total = 10 * SEG

    def hold(flow, now):
        reply = Fth(Opcode.ACK, 0, SEG, flow, SEG, 0).encode()
        assert coalescer.offer(reply, "peer", now, total) == []

    for flow in range(200):
        hold(flow, float(flow))
    assert len(coalescer.due(150.0)) == 150  # 50 held, 200 entries
    hold(1000, 300.0)
    assert len(coalescer._since) == len(coalescer.held) == 51
    assert coalescer.deadline() == 150.0 + 1.0
