"""What a hostile or broken peer can do to the cores: memory, totals, give-up, counting."""

import tracemalloc

import pytest
from helpers import ack, cnp, data, nack, only, parse, trim
from link import Impairments, Link

from common.wire import PACKET_BYTES, Flag, Opcode
from host_agent.core import (
    DcqcnParams,
    ForgiveReceiver,
    ForgiveSender,
    ReceiverPolicy,
    SenderCounts,
)

K = PACKET_BYTES
FLOW = 7
MAX_TOTAL = 2**32 - 1


def receiver(**policy):
    rx = ForgiveReceiver(ReceiverPolicy(**policy))
    rx.begin_step(1, critical=False, expected_bytes=100 * K)
    return rx


def sender(**kwargs):
    return ForgiveSender(DcqcnParams(line_rate_bps=10e9), rto=1e-3, rto_max=4e-3, **kwargs)


# -- memory follows the bytes held ------------------------------------------------


@pytest.mark.parametrize("seq", [2**28, MAX_TOTAL - K])
def test_a_packet_far_out_costs_its_payload_not_its_offset(seq):
    rx = receiver()
    rx.register_flow(FLOW, step=1, gradient=True, keep_payload=True)
    tracemalloc.start()
    try:
        reply = only(rx.receive(data(FLOW, seq, K, MAX_TOTAL), False, 0.0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (reply.opcode, reply.aux, reply.length) == (Opcode.ACK, seq, K)
    assert peak < 64 * K
    assert rx.flow_state(FLOW).received_bytes == K


def test_held_bytes_move_into_place_once_the_gaps_settle():
    rx = receiver(vesting=False)
    rx.register_flow(FLOW, step=1, gradient=True, keep_payload=True)
    total = 6 * K
    for seq, fill in ((4 * K, 5), (2 * K, 3), (5 * K, 6)):
        rx.receive(data(FLOW, seq, K, total, fill=fill), False, 0.0)
    rx.receive(trim(FLOW, K, K, total), False, 0.0)  # forgiven, above the hole at 0
    rx.receive(data(FLOW, 0, K, total, fill=1), False, 0.0)
    rx.receive(trim(FLOW, 3 * K, K, total), False, 0.0)  # forgiven, completes the flow
    assert rx.flow_state(FLOW).complete
    expected = [1, 0, 3, 0, 5, 6]
    assert rx.payload(FLOW) == b"".join(bytes([b]) * K for b in expected)


# -- the receiving side's size is authoritative ---------------------------------------


def test_registered_size_rejects_a_stray_first_packet_and_the_flow_completes():
    rx = receiver()
    rx.register_flow(FLOW, step=1, gradient=True, size=3 * K)
    assert rx.flow_state(FLOW).total == 3 * K
    assert rx.receive(data(FLOW, 0, K, 99 * K), False, 0.0) == []  # stray: another total
    assert rx.receive(data(FLOW, 2**28, K, MAX_TOTAL), False, 0.0) == []
    for seq in range(0, 3 * K, K):
        assert only(rx.receive(data(FLOW, seq, K, 3 * K), False, 0.0)).opcode == Opcode.ACK
    assert rx.flow_state(FLOW).complete and rx.take_completed() == [FLOW]
    assert rx.rejected == {"total_mismatch": 2}


def test_registered_size_holds_for_trimmed_headers_too():
    rx = receiver()
    rx.register_flow(FLOW, step=1, gradient=True, size=3 * K)
    assert rx.receive(trim(FLOW, 5 * K, K, 6 * K), False, 0.0) == []
    assert rx.rejected == {"total_mismatch": 1}
    assert rx.step_state(1).outstanding == 0 and rx.flow_ranges(FLOW) == []


@pytest.mark.parametrize("size", [0, -1, 2**32, 1.5, "4096"])
def test_registered_size_is_validated(size):
    rx = receiver()
    with pytest.raises(ValueError, match="flow size"):
        rx.register_flow(FLOW, step=1, gradient=True, size=size)


def test_stray_packet_first_no_longer_stalls_the_flow_end_to_end():
    size = 64 * K
    tx = sender()
    rx = receiver()
    rx.register_flow(1, step=1, gradient=False, size=size)
    rx.receive(data(1, 0, K, 5 * K), False, 0.0)  # arrives before the real flow
    tx.open_flow(1, size, now=0.0)
    Link(tx, rx, forward=Impairments(delay=5e-6)).run(until=1.0)
    assert tx.flow_state(1).done and rx.flow_state(1).complete
    assert tx.take_failed() == [] and rx.rejected == {"total_mismatch": 1}


# -- a sender gives up -----------------------------------------------------------------


def drive(tx, until):
    """Poll at every deadline; nothing ever answers. Returns the DATA packets sent."""
    sent, now = 0, 0.0
    while True:
        sent += len(tx.poll(now))
        deadline = tx.next_deadline()
        if deadline is None or deadline > until:
            return sent
        now = max(now, deadline)


def test_sender_gives_up_after_max_timeouts_without_progress():
    tx = sender(max_timeouts=4)
    tx.open_flow(1, 8 * K, now=0.0)
    sent = drive(tx, until=10.0)
    state = tx.flow_state(1)
    assert state.failed and not state.done and state.rtos >= 4
    assert sent > 8  # resent on the first three timeout rounds, then nothing
    assert tx.next_deadline() is None and tx.poll(100.0) == []
    assert tx.take_failed() == [1] and tx.take_failed() == []
    assert tx.take_completed() == []
    tx.receive(ack(1, 8 * K, 0, K), 100.0)  # too late: the flow stays failed
    assert tx.flow_state(1).failed and not tx.flow_state(1).done
    assert tx.rejected == {"failed_flow": 1}


def test_a_burst_expiring_segment_by_segment_is_one_timeout_round():
    """A window of segments sent back to back at 1 Gb/s times out one segment at a time once
    the timeout stops growing; giving up must still take every backed-off round."""
    tx = ForgiveSender(DcqcnParams(line_rate_bps=1e9), rto=1e-3, rto_max=4e-3, max_timeouts=6)
    tx.open_flow(1, 64 * K, now=0.0)
    now = 0.0
    tx.poll(now)
    while not tx.take_failed():
        now = tx.next_deadline()
        assert now is not None
        tx.poll(now)
    rounds = sum(min(1e-3 * 2**k, 4e-3) for k in range(5))  # five rounds, the sixth gives up
    assert now >= rounds
    assert tx.flow_state(1).rtos > 6  # segments expired one by one, each resent


def test_any_progress_resets_the_timeout_count():
    tx = sender(max_timeouts=2)
    tx.open_flow(1, 8 * K, now=0.0)
    now, acked = 0.0, 0
    while tx.flow_state(1).rtos < 6:
        tx.poll(now)
        now = tx.next_deadline()
        if tx.flow_state(1).rtos > acked // K:  # a timeout since the last ACK
            acked += K
            tx.receive(ack(1, acked, acked - K, K), now)  # progress: one more segment
    state = tx.flow_state(1)
    assert not state.failed and tx.take_failed() == []
    assert tx.next_deadline() is not None


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "5"])
def test_max_timeouts_is_validated(bad):
    with pytest.raises(ValueError, match="max_timeouts"):
        sender(max_timeouts=bad)


# -- every rejected packet counted once, where it is rejected ------------------------------


def test_sender_counts_each_rejected_packet_once_by_reason_and_applies_nothing():
    tx = sender()
    tx.open_flow(1, 4 * K, now=0.0)
    tx.poll(0.0)
    before = tx.flow_state(1)
    flags = Flag.ELIGIBLE  # had any of these been applied, the flow would be exempt
    for packet in (
        b"\x11",
        ack(1, 0, 0, K)[:15] + b"\x00\x00",  # trailing payload on an ACK
        data(1, 0, K, 4 * K),
        ack(9, K, 0, K),
        ack(1, 5 * K, 0, K, flags=flags),  # rcv_nxt past the flow
        ack(1, K, 4 * K, K, flags=flags),  # selective range past the flow
        nack(1, 4 * K, K, 0, flags=flags),
    ):
        tx.receive(packet, 1e-6)
    assert tx.rejected == {
        "short": 1, "bad_header": 1, "not_control": 1, "unknown_flow": 1, "out_of_range": 3,
    }  # fmt: skip
    assert tx.stats == SenderCounts(malformed=6, unknown_flow=1)
    assert tx.flow_state(1) == before


def test_receiver_counts_each_rejected_packet_once_by_reason():
    rx = receiver()
    rx.register_flow(FLOW, step=1, gradient=True)
    rx.receive(data(FLOW, 0, K, 10 * K), False, 0.0)
    for packet in (
        b"\x10\x00",
        data(FLOW, 0, K, 10 * K)[:-1],
        data(FLOW, 10 * K, K, 10 * K)[:8] + (10 * K).to_bytes(4, "big") * 2 + bytes(K),
        ack(FLOW, 0, 0, K),
        data(99, 0, K, 10 * K),
        data(FLOW, K, K, 11 * K),
    ):
        assert rx.receive(packet, True, 1.0) == []
    assert rx.rejected == {
        "short": 1, "bad_header": 1, "out_of_range": 1, "not_data": 1,
        "unknown_flow": 1, "total_mismatch": 1,
    }  # fmt: skip
    assert rx.stats.malformed == 5 and rx.stats.unknown_flow == 1
    assert rx.flow_state(FLOW).ce_marks == 0


# -- the ECN echo on the report that ends an exemption -----------------------------------


def exhausting_receiver():
    """A receiver whose next forgiveness exhausts the step's budget (10 K)."""
    rx = ForgiveReceiver(ReceiverPolicy(vesting=False))
    rx.begin_step(1, critical=False, expected_bytes=100 * K)
    rx.register_flow(1, step=1, gradient=True)
    for seq in range(0, 9 * K, K):
        assert not parse(rx.receive(trim(1, seq, K, 100 * K), False, 0.0))[0].flags & (
            Flag.EXHAUSTED
        )
    return rx


def test_forgiveness_ack_that_ends_the_exemption_cuts_the_rate_once():
    rx = exhausting_receiver()
    tx = sender()
    tx.open_flow(1, 100 * K, now=0.0)
    tx.poll(0.0)
    tx.receive(ack(1, 0, 0, K, flags=Flag.ELIGIBLE), 1e-6)
    assert tx.flow_state(1).cc_mode == "exempt"
    replies = rx.receive(trim(1, 9 * K, K, 100 * K), True, 1e-5)
    assert [r.opcode for r in parse(replies)] == [Opcode.CNP, Opcode.ACK]
    assert parse(replies)[1].flags == Flag.ECE | Flag.ELIGIBLE | Flag.EXHAUSTED
    for reply in replies:
        tx.receive(reply, 2e-5)
    state = tx.flow_state(1)
    assert state.cc_mode == "obeying" and state.cnps_ignored == 1
    assert state.rate_cuts == 1 and state.rate_bps < 10e9


def test_echo_on_an_obeying_flow_adds_no_cut_to_the_cnp():
    tx = sender()
    tx.open_flow(1, 100 * K, now=0.0)
    tx.receive(cnp(1), 1e-5)
    tx.receive(ack(1, 0, 0, 0, flags=Flag.ECE), 1e-5)
    assert tx.flow_state(1).rate_cuts == 1


# -- the notification point's window end (docs/dcqcn.md) ------------------------------------


def test_mark_inside_the_window_is_sent_at_its_end():
    rx = receiver(cnp_interval=50e-6)
    rx.register_flow(FLOW, step=1, gradient=True)
    assert rx.next_deadline() is None
    replies = parse(rx.receive(data(FLOW, 0, K, 10 * K), True, 0.0))
    assert [r.opcode for r in replies] == [Opcode.CNP, Opcode.ACK]
    for i, t in enumerate((10e-6, 20e-6)):  # two marks inside: one CNP at the end
        assert only(rx.receive(data(FLOW, (i + 1) * K, K, 10 * K), True, t)).opcode == Opcode.ACK
    assert rx.next_deadline() == pytest.approx(50e-6)
    assert rx.poll(49e-6) == []
    assert only(rx.poll(50e-6)).opcode == Opcode.CNP
    assert rx.poll(1.0) == [] and rx.next_deadline() is None
    assert rx.flow_state(FLOW).cnps_sent == 2
    # the window restarted at 50 us: a mark at 80 us waits for 100 us
    rx.receive(data(FLOW, 3 * K, K, 10 * K), True, 80e-6)
    assert rx.next_deadline() == pytest.approx(100e-6)


def test_no_mark_inside_the_window_sends_nothing_at_its_end():
    rx = receiver()
    rx.register_flow(FLOW, step=1, gradient=True)
    rx.receive(data(FLOW, 0, K, 10 * K), True, 0.0)
    rx.receive(data(FLOW, K, K, 10 * K), False, 10e-6)
    assert rx.next_deadline() is None and rx.poll(1.0) == []


def test_without_window_end_a_mark_inside_the_interval_sends_nothing():
    rx = receiver(cnp_interval=4e-6, cnp_at_window_end=False)
    rx.register_flow(FLOW, step=1, gradient=True)
    rx.receive(data(FLOW, 0, K, 10 * K), True, 0.0)
    rx.receive(data(FLOW, K, K, 10 * K), True, 2e-6)
    assert rx.next_deadline() is None and rx.poll(1.0) == []
    assert [r.opcode for r in parse(rx.receive(data(FLOW, 2 * K, K, 10 * K), True, 4e-6))] == [
        Opcode.CNP, Opcode.ACK,
    ]  # fmt: skip


def test_completed_or_forgotten_flows_get_no_late_cnp():
    rx = receiver()
    rx.register_flow(1, step=1, gradient=False)
    rx.register_flow(2, step=1, gradient=False)
    for flow in (1, 2):
        rx.receive(data(flow, 0, K, 2 * K), True, 0.0)
        rx.receive(data(flow, K, K, 2 * K), True, 10e-6)
    assert rx.flow_state(1).complete
    rx.forget_flow(2)
    assert rx.next_deadline() is None and rx.poll(1.0) == []
