"""Every branch of OnTrimmedHeader, every row of the arrival table, Flags and the step state."""

import pytest
from helpers import data, only, parse, trim

from common.wire import PACKET_BYTES, Flag, Opcode
from host_agent.core import ForgiveReceiver, ReceiverPolicy, StepState

K = PACKET_BYTES
FLOW = 7


def receiver(expected=100 * K, critical=False, gradient=True, step=1, **policy):
    rx = ForgiveReceiver(ReceiverPolicy(**policy))
    rx.begin_step(step, critical=critical, expected_bytes=expected)
    rx.register_flow(FLOW, step=step, gradient=gradient)
    return rx


def fill(rx, upto, total, flow=FLOW):
    """Deliver [0, upto) in order so that `received` vests some budget."""
    for seq in range(0, upto, K):
        rx.receive(data(flow, seq, K, total), False, 0.0)


# -- OnStepBegin / OnAllReduceComplete ------------------------------------------


def test_step_begin_sets_p_and_floor_budget():
    rx = ForgiveReceiver(ReceiverPolicy(p_low=0.005, p_high=0.1))
    rx.begin_step(1, critical=True, expected_bytes=1_000_001)
    rx.begin_step(2, critical=False, expected_bytes=1_000_001)
    assert rx.step_state(1) == StepState(
        p=0.005, budget=5000, expected=1_000_001, received=0,
        forgiven=0, outstanding=0, open=True, excess=0,
    )  # fmt: skip
    assert rx.step_state(2).budget == 100_000
    with pytest.raises(ValueError, match="already begun"):
        rx.begin_step(1, critical=False, expected_bytes=1)


def test_complete_step_closes_the_budget_for_good():
    rx = receiver()
    fill(rx, 50 * K, 100 * K)
    rx.complete_step(1)
    reply = only(rx.receive(trim(FLOW, 50 * K, K, 100 * K), False, 1.0))
    assert reply.opcode == Opcode.NACK
    assert rx.step_state(1).forgiven == 0 and rx.step_state(1).open is False


# -- OnTrimmedHeader, branch by branch ---------------------------------------------


def test_trimmed_header_with_nothing_missing_acks_and_charges_nothing():
    rx = receiver()
    fill(rx, 3 * K, 100 * K)
    before = rx.step_state(1)
    reply = only(rx.receive(trim(FLOW, K, K, 100 * K), False, 1.0))  # Received row
    assert (reply.opcode, reply.seq, reply.aux, reply.length) == (Opcode.ACK, 3 * K, K, K)
    assert rx.step_state(1) == before


def test_a_trimmed_header_keeping_cut_payload_is_the_same_trim():
    """A trim size past the headers leaves some payload behind the FTH: ignored, the range
    is decided exactly as for a bare header, and nothing counts as received."""
    bare, cut = receiver(), receiver()
    for rx in (bare, cut):
        fill(rx, 20 * K, 100 * K)
    header = trim(FLOW, 20 * K, K, 100 * K)
    got = [
        only(rx.receive(pkt, False, 1.0)) for rx, pkt in ((bare, header), (cut, header + bytes(70)))
    ]
    assert got[0] == got[1] and got[0].opcode == Opcode.ACK  # forgiven, p = 0.1
    assert bare.step_state(1) == cut.step_state(1)
    assert cut.step_state(1).received == 20 * K and cut.rejected == {}


def test_non_gradient_flow_is_never_forgiven():
    rx = receiver(gradient=False)
    fill(rx, 50 * K, 100 * K)
    reply = only(rx.receive(trim(FLOW, 50 * K, K, 100 * K), False, 1.0))
    assert (reply.opcode, reply.seq, reply.length, reply.aux) == (Opcode.NACK, 50 * K, K, 50 * K)
    assert reply.flags == 0  # never exemption-eligible
    assert rx.step_state(1).forgiven == 0 and rx.step_state(1).received == 0
    assert rx.flow_ranges(FLOW) == [(50 * K, 51 * K, "requested")]


def test_no_open_budget_means_repair():
    rx = ForgiveReceiver(ReceiverPolicy())
    rx.register_flow(FLOW, step=9, gradient=True)  # step 9 never classified
    assert rx.flow_state(FLOW).exemption_eligible is False
    reply = only(rx.receive(trim(FLOW, 0, K, 10 * K), False, 0.0))
    assert reply.opcode == Opcode.NACK and reply.flags == 0
    assert rx.step_state(9) is None


def test_vesting_refuses_early_and_allows_once_enough_has_arrived():
    rx = receiver(expected=100 * K)  # p = 0.1, budget = 10 K
    fill(rx, 8 * K, 100 * K)  # received 8K: p*(8K+K) = 0.9K < K
    reply = only(rx.receive(trim(FLOW, 8 * K, K, 100 * K), False, 1.0))
    assert reply.opcode == Opcode.NACK
    st = rx.step_state(1)
    assert (st.forgiven, st.outstanding) == (0, K)
    # 9 more packets arrive above the hole; received = 17K, 0.1*(17K+K) = 1.8K >= K.
    for seq in range(9 * K, 18 * K, K):
        rx.receive(data(FLOW, seq, K, 100 * K), False, 1.0)
    reply = only(rx.receive(trim(FLOW, 8 * K, K, 100 * K), False, 2.0))
    assert (reply.opcode, reply.seq) == (Opcode.ACK, 18 * K)
    st = rx.step_state(1)
    assert (st.forgiven, st.outstanding, st.received) == (K, 0, 17 * K)


def test_vesting_boundary_is_exact():
    # forgiven + len <= p * (received + forgiven + len): with p = 0.1 and len = 100,
    # received must be at least 900.
    rx = ForgiveReceiver(ReceiverPolicy(p_high=0.1))
    rx.begin_step(1, critical=False, expected_bytes=10_000)
    rx.register_flow(FLOW, step=1, gradient=True)
    rx.receive(data(FLOW, 0, 899, 10_000), False, 0.0)
    assert only(rx.receive(trim(FLOW, 899, 100, 10_000), False, 0.0)).opcode == Opcode.NACK
    rx.receive(data(FLOW, 999, 1, 10_000), False, 0.0)  # received = 900
    assert only(rx.receive(trim(FLOW, 899, 100, 10_000), False, 0.0)).opcode == Opcode.ACK


def test_full_budget_policy_skips_vesting():
    rx = receiver(vesting=False)
    reply = only(rx.receive(trim(FLOW, 0, K, 100 * K), False, 0.0))
    assert (reply.opcode, reply.seq) == (Opcode.ACK, K)
    assert rx.step_state(1).forgiven == K


def test_draw_refusal_charges_nothing_and_stays_outstanding():
    rx = receiver(forgive_prob=0.0)
    fill(rx, 50 * K, 100 * K)
    reply = only(rx.receive(trim(FLOW, 50 * K, K, 100 * K), False, 1.0))
    assert reply.opcode == Opcode.NACK
    st = rx.step_state(1)
    assert (st.forgiven, st.outstanding) == (0, K)
    # trimmed again: only new bytes count, so outstanding stays K
    rx.receive(trim(FLOW, 50 * K, K, 100 * K), False, 2.0)
    assert rx.step_state(1).outstanding == K
    # the retransmission arrives: Requested -> Received, outstanding back to 0
    reply = only(rx.receive(data(FLOW, 50 * K, K, 100 * K), False, 3.0))
    assert reply.opcode == Opcode.ACK and reply.seq == 51 * K
    st = rx.step_state(1)
    assert (st.outstanding, st.received) == (0, 51 * K)


def test_draw_is_seeded_and_fresh_per_header():
    def decisions(seed):
        rx = receiver(forgive_prob=0.5, seed=seed, expected=1000 * K)
        fill(rx, 500 * K, 1000 * K)
        return [
            only(rx.receive(trim(FLOW, seq, K, 1000 * K), False, 1.0)).opcode
            for seq in range(500 * K, 540 * K, K)
        ]

    a, b, c = decisions(1), decisions(1), decisions(2)
    assert a == b and a != c
    assert Opcode.ACK in a and Opcode.NACK in a


def test_forgiving_charges_once_and_advances_past_the_hole():
    rx = receiver()
    fill(rx, 50 * K, 100 * K)
    rx.receive(data(FLOW, 51 * K, K, 100 * K), False, 1.0)
    reply = only(rx.receive(trim(FLOW, 50 * K, K, 100 * K), True, 1.0)[-1:])
    assert (reply.opcode, reply.seq, reply.aux, reply.length) == (Opcode.ACK, 52 * K, 50 * K, K)
    assert reply.flags & Flag.ECE and reply.flags & Flag.ELIGIBLE
    assert rx.step_state(1).forgiven == K
    # Forgiven row, trimmed again: ACK, no charge
    reply = only(rx.receive(trim(FLOW, 50 * K, K, 100 * K), False, 2.0))
    assert reply.opcode == Opcode.ACK and rx.step_state(1).forgiven == K
    # Forgiven row, data arrives: payload discarded, no credit back
    reply = only(rx.receive(data(FLOW, 50 * K, K, 100 * K, fill=0x11), False, 3.0))
    assert reply.opcode == Opcode.ACK
    st = rx.step_state(1)
    assert (st.forgiven, st.received) == (K, 51 * K)
    assert rx.payload(FLOW)[50 * K : 51 * K] == bytes(K)


def test_partly_received_range_counts_only_missing_bytes():
    # A re-segmented retransmission straddles data already delivered.
    rx = receiver(vesting=False)
    rx.receive(data(FLOW, 0, 1000, 100 * K), False, 0.0)
    rx.receive(data(FLOW, 1500, 500, 100 * K), False, 0.0)
    reply = only(rx.receive(trim(FLOW, 500, 2000, 100 * K), False, 1.0))
    assert (reply.opcode, reply.seq) == (Opcode.ACK, 2500)
    assert rx.step_state(1).forgiven == 500 + 500  # [1000,1500) and [2000,2500)
    assert rx.flow_state(FLOW).received_bytes == 1500


def test_repair_keeps_received_bytes_and_marks_only_unsettled():
    rx = receiver(forgive_prob=0.0)
    fill(rx, 50 * K, 100 * K)
    rx.receive(data(FLOW, 50 * K + 100, 100, 100 * K), False, 0.0)
    reply = only(rx.receive(trim(FLOW, 50 * K, K, 100 * K), False, 1.0))
    assert (reply.opcode, reply.seq, reply.length) == (Opcode.NACK, 50 * K, K)
    assert rx.flow_ranges(FLOW) == [
        (50 * K, 50 * K + 100, "requested"),
        (50 * K + 100, 50 * K + 200, "received"),
        (50 * K + 200, 51 * K, "requested"),
    ]
    assert rx.step_state(1).outstanding == K - 100


# -- The arrival table: data packet arrives ------------------------------------------


def test_absent_range_arrives_received_and_acked():
    rx = receiver()
    reply = only(rx.receive(data(FLOW, 2 * K, K, 100 * K), False, 0.0))
    assert (reply.opcode, reply.seq, reply.aux, reply.length) == (Opcode.ACK, 0, 2 * K, K)
    assert rx.flow_ranges(FLOW) == [(2 * K, 3 * K, "received")]


def test_received_range_arriving_again_is_acked_without_credit():
    rx = receiver()
    rx.receive(data(FLOW, 0, K, 100 * K), False, 0.0)
    rx.receive(data(FLOW, 2 * K, K, 100 * K), False, 0.0)
    for seq in (0, 2 * K):
        reply = only(rx.receive(data(FLOW, seq, K, 100 * K), False, 1.0))
        assert reply.opcode == Opcode.ACK
    assert rx.step_state(1).received == 2 * K
    assert rx.stats.duplicate == 2


def test_flow_completes_once_and_payload_is_delivered_in_place():
    rx = receiver(expected=3 * K)
    for seq, fill_byte in ((2 * K, 3), (0, 1), (K, 2)):
        rx.receive(data(FLOW, seq, K, 3 * K, fill=fill_byte), False, 0.0)
    assert rx.flow_state(FLOW).complete and rx.take_completed() == [FLOW]
    rx.receive(data(FLOW, 0, K, 3 * K), False, 0.0)
    assert rx.take_completed() == []
    assert rx.payload(FLOW) == bytes([1]) * K + bytes([2]) * K + bytes([3]) * K


# -- Flags ---------------------------------------------------------------------------


def test_flags_eligible_and_exhausted_on_every_ack_and_nack():
    rx = receiver(expected=100 * K)  # budget 10K: exhausted while forgiven+outstanding+K > 10K
    replies = []
    for seq in range(0, 90 * K, K):
        replies += rx.receive(data(FLOW, seq, K, 100 * K), False, 0.0)
    assert all(r.flags == Flag.ELIGIBLE for r in parse(replies))
    outcomes = []
    for seq in range(90 * K, 100 * K, K):
        r = only(rx.receive(trim(FLOW, seq, K, 100 * K), False, 1.0))
        st = rx.step_state(1)
        exhausted = st.forgiven + st.outstanding + K > st.budget
        assert bool(r.flags & Flag.EXHAUSTED) == exhausted and r.flags & Flag.ELIGIBLE
        outcomes.append((r.opcode, exhausted))
    # vesting allows all ten; the tenth leaves no room for one more packet
    assert outcomes == [(Opcode.ACK, False)] * 9 + [(Opcode.ACK, True)]


def test_flow_on_a_zero_p_step_or_without_exemption_is_not_eligible():
    rx = receiver(p_high=0.0)
    assert rx.flow_state(FLOW).exemption_eligible is False
    assert only(rx.receive(data(FLOW, 0, K, 2 * K), False, 0.0)).flags == 0
    rx = receiver(exemption=False)
    assert rx.flow_state(FLOW).exemption_eligible is False
    fill(rx, 50 * K, 100 * K)
    reply = only(rx.receive(trim(FLOW, 50 * K, K, 100 * K), False, 1.0))
    assert reply.opcode == Opcode.ACK and reply.flags == 0  # forgiven, but never exempt


def test_flow_registered_after_its_step_closed_is_not_eligible():
    rx = receiver()
    rx.complete_step(1)
    rx.register_flow(8, step=1, gradient=True)
    assert rx.flow_state(8).exemption_eligible is False


# -- CNPs ------------------------------------------------------------------------------


def test_cnp_at_most_once_per_flow_per_interval():
    rx = receiver(cnp_interval=50e-6)
    kinds = []
    for i, now in enumerate((0.0, 10e-6, 49e-6, 50e-6, 60e-6, 120e-6)):
        kinds.append(
            [r.opcode for r in parse(rx.receive(data(FLOW, i * K, K, 100 * K), True, now))]
        )
    assert kinds == [
        [Opcode.CNP, Opcode.ACK],
        [Opcode.ACK],
        [Opcode.ACK],
        [Opcode.CNP, Opcode.ACK],
        [Opcode.ACK],
        [Opcode.CNP, Opcode.ACK],
    ]
    assert all(
        r.flags & Flag.ECE for r in parse(rx.receive(data(FLOW, 9 * K, K, 100 * K), True, 1.0))[1:]
    )
    assert rx.flow_state(FLOW).cnps_sent == 4
    assert [r.opcode for r in parse(rx.receive(data(FLOW, 10 * K, K, 100 * K), False, 2.0))] == [
        Opcode.ACK
    ]


# -- Robustness -----------------------------------------------------------------------


def test_unknown_flow_and_inconsistent_total_are_counted_and_dropped():
    rx = receiver()
    assert rx.receive(data(99, 0, K, 10 * K), False, 0.0) == []
    assert rx.stats.unknown_flow == 1
    rx.receive(data(FLOW, 0, K, 10 * K), False, 0.0)
    assert rx.receive(data(FLOW, K, K, 11 * K), False, 0.0) == []
    assert rx.stats.malformed == 1
    assert rx.flow_state(FLOW).rcv_nxt == K


def test_oversending_sender_cannot_push_forgiven_past_the_budget():
    # The step expects 20K, but the sender's flow is 100K long.
    rx = receiver(expected=20 * K, vesting=False)
    fill(rx, 60 * K, 100 * K)
    st = rx.step_state(1)
    assert st.received == 20 * K and st.excess == 40 * K
    for seq in range(60 * K, 100 * K, K):
        rx.receive(trim(FLOW, seq, K, 100 * K), False, 1.0)
    st = rx.step_state(1)
    assert st.forgiven <= st.budget and st.received + st.forgiven <= st.expected


def test_policy_validation():
    with pytest.raises(ValueError, match="p_high"):
        ReceiverPolicy(p_high=1.0)
    with pytest.raises(ValueError, match="forgive_prob"):
        ReceiverPolicy(forgive_prob=1.5)


def test_payload_is_kept_per_flow_and_grows_with_the_data():
    rx = ForgiveReceiver(ReceiverPolicy(keep_payload=False))
    rx.begin_step(1, critical=False, expected_bytes=10 * K)
    rx.register_flow(1, step=1, gradient=True)
    rx.register_flow(2, step=1, gradient=True, keep_payload=True)
    for flow in (1, 2):
        rx.receive(data(flow, K, K, 4 * K, fill=9), False, 0.0)
    assert rx.payload(1) == b""
    assert rx.payload(2) == bytes(K) + bytes([9]) * K + bytes(2 * K)


def test_tiny_segments_are_packed_so_memory_follows_the_bytes():
    # A peer may send one byte per DATA packet; the kept bytes must not cost an object each.
    from host_agent.core.receiver import _PACK_UPTO

    total = 3 * _PACK_UPTO
    rx = ForgiveReceiver(ReceiverPolicy(p_low=0.0, p_high=0.0))
    rx.register_flow(5, step=0, gradient=False, keep_payload=True)
    content = bytes(range(256)) * (total // 256)
    for seq in range(total):
        rx.receive(data(5, seq, 1, total, fill=content[seq]), False, 0.0)
    assert rx.flow_state(5).complete
    assert len(rx._flows[5].parts) <= total // _PACK_UPTO + 1
    assert rx.payload(5) == content


def test_forgiven_ranges_outlive_the_scoreboard_and_match_the_zero_fill():
    rx = receiver(expected=40 * K)
    fill(rx, 30 * K, 40 * K)
    for seq in (30 * K, 31 * K, 33 * K):  # two adjacent ranges merge, one stands apart
        assert only(rx.receive(trim(FLOW, seq, K, 40 * K), False, 1.0)).opcode == Opcode.ACK
    rx.receive(data(FLOW, 32 * K, K, 40 * K), False, 0.0)
    for seq in range(34 * K, 40 * K, K):
        rx.receive(data(FLOW, seq, K, 40 * K), False, 0.0)
    assert rx.flow_state(FLOW).complete and rx.flow_ranges(FLOW) == []
    assert rx.forgiven_ranges(FLOW) == [(30 * K, 32 * K), (33 * K, 34 * K)]
    payload = rx.payload(FLOW)
    zero = [i for i in range(0, 40 * K, K) if payload[i : i + K] == bytes(K)]
    assert zero == [30 * K, 31 * K, 33 * K]
