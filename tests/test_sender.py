"""Sender: segmentation, pacing, selective repeat, RTO with backoff, the mode bit and DCQCN."""

import itertools

import pytest
from helpers import ack, cnp, nack

from common.wire import PACKET_BYTES, TRIMMED_FRAME_LEN, Flag, Opcode, decode
from host_agent.core import (
    EXEMPT,
    OBEYING,
    DcqcnParams,
    DcqcnRate,
    ForgiveSender,
    SenderCounts,
    new_rate,
)

K = PACKET_BYTES
GBPS = 1e9
ELIGIBLE = Flag.ELIGIBLE
EXHAUSTED = Flag.ELIGIBLE | Flag.EXHAUSTED


def sender(rate=10 * GBPS, rto=10.0, rto_max=10.0):
    """A sender whose timeout stays out of the way unless a test asks for it."""
    return ForgiveSender(DcqcnParams(line_rate_bps=rate), rto=rto, rto_max=rto_max)


def drain(tx, until=1.0):
    """Poll at every deadline up to `until`; return (time, header, payload) per packet."""
    out, now = [], 0.0
    while True:
        for pkt in tx.poll(now):
            hdr, payload = decode(pkt)
            out.append((now, hdr, bytes(payload)))
        deadline = tx.next_deadline()
        if deadline is None or deadline > until:
            return out
        now = max(now, deadline)


def test_segments_are_at_most_one_packet_and_carry_the_flow():
    tx = sender()
    data = bytes(range(256)) * 40  # 10240 bytes
    tx.open_flow(3, len(data), now=0.0, data=data)
    pkts = drain(tx, until=1e-3)
    assert [(h.seq, h.length) for _, h, _ in pkts] == [(0, K), (K, K), (2 * K, 2048)]
    assert tx.flow_state(3).sent_packets == 3
    assert all(
        h.opcode == Opcode.DATA and h.aux == len(data) and h.flow_id == 3 for _, h, _ in pkts
    )
    assert [bool(h.flags & Flag.LAST) for _, h, _ in pkts] == [False, False, True]
    assert b"".join(p for _, _, p in pkts) == data


def test_pacing_spaces_packets_at_the_line_rate():
    tx = sender(rate=1 * GBPS)
    tx.open_flow(1, 8 * K, now=0.0)
    times = [t for t, _, _ in drain(tx)]
    gap = (K + TRIMMED_FRAME_LEN) * 8 / 1e9
    assert times[0] == 0.0
    assert all(b - a == pytest.approx(gap) for a, b in itertools.pairwise(times))


def test_two_flows_share_the_nic_line_rate():
    tx = sender(rate=1 * GBPS)
    tx.open_flow(1, 8 * K, now=0.0)
    tx.open_flow(2, 8 * K, now=0.0)
    pkts = drain(tx)
    assert len(pkts) == 16 and {h.flow_id for _, h, _ in pkts} == {1, 2}
    gap = (K + TRIMMED_FRAME_LEN) * 8 / 1e9
    assert pkts[-1][0] == pytest.approx(15 * gap)


def test_selective_repeat_resends_only_the_requested_range():
    tx = sender()
    tx.open_flow(1, 4 * K, now=0.0)
    assert len(drain(tx, until=1e-4)) == 4
    tx.receive(ack(1, K, 0, K), 1e-4)
    tx.receive(nack(1, K, K, K), 1e-4)
    tx.receive(ack(1, K, 2 * K, K), 1e-4)
    tx.receive(ack(1, K, 3 * K, K), 1e-4)
    resent = drain(tx, until=2e-4)
    assert [(h.seq, h.length, h.flags & Flag.RETX) for _, h, _ in resent] == [(K, K, Flag.RETX)]
    tx.receive(ack(1, 4 * K, K, K), 3e-4)
    assert tx.flow_state(1).done and tx.take_completed() == [1]
    assert tx.flow_state(1).retransmitted_bytes == K
    assert tx.next_deadline() is None


def test_nack_for_partly_acked_range_resends_only_missing_bytes():
    tx = sender()
    tx.open_flow(1, 2 * K, now=0.0)
    drain(tx, until=1e-4)
    tx.receive(ack(1, 0, 100, 200), 1e-4)  # [100, 300) arrived in an earlier re-segmentation
    tx.receive(nack(1, 0, K, 0), 1e-4)
    resent = [(h.seq, h.length) for _, h, _ in drain(tx, until=2e-4)]
    assert resent == [(0, 100), (300, K - 300)]


def test_rto_resends_a_lost_packet_with_exponential_backoff():
    tx = sender(rto=1e-3, rto_max=3e-3)
    tx.open_flow(1, K, now=0.0)
    sends = drain(tx, until=10e-3)
    times = [t for t, _, _ in sends]
    assert times == pytest.approx(
        [0.0, 1e-3, 3e-3, 6e-3, 9e-3]
    )  # backoff 1, 2, then capped at 3 ms
    assert all(h.flags & Flag.RETX for _, h, _ in sends[1:])
    assert tx.flow_state(1).rtos == 4
    tx.receive(ack(1, K, 0, K), 9.5e-3)
    assert tx.flow_state(1).done and tx.next_deadline() is None


def test_an_ack_too_soon_for_the_resend_is_counted_late_and_rtts_are_kept():
    tx = sender(rto=1e-3, rto_max=1e-3)
    tx.open_flow(1, 3 * K, now=0.0)
    drain(tx, until=1e-5)  # all three segments leave at once
    tx.receive(ack(1, K, 0, K), 0.4e-3)  # segment 0: one round trip of 0.4 ms
    assert len(tx.poll(1.01e-3)) == 1  # segments 1 and 2 time out; 1 is resent at once
    tx.receive(ack(1, 2 * K, K, K), 1.1e-3)  # 0.09 ms after its resend: the first copy's ACK
    tx.receive(nack(1, 2 * K, K, 2 * K), 1.1e-3)  # segment 2 was trimmed: resent on request
    drain(tx, until=1.2e-3)
    tx.receive(ack(1, 3 * K, 2 * K, K), 1.7e-3)  # a full round trip after its resend
    state = tx.flow_state(1)
    assert state.done and state.late_acks == 1
    assert state.rtt_max == pytest.approx(0.4e-3)


def test_acked_packet_never_times_out():
    tx = sender(rto=1e-3)
    tx.open_flow(1, 2 * K, now=0.0)
    drain(tx, until=1e-4)
    tx.receive(ack(1, 0, K, K), 2e-4)  # only the second packet acked
    sends = drain(tx, until=1.5e-3)
    assert [(t, h.seq) for t, h, _ in sends] == [(pytest.approx(1e-3), 0)]


def test_mode_follows_the_latest_report():
    tx = sender()
    tx.open_flow(1, 100 * K, now=0.0)
    assert tx.flow_state(1).cc_mode == OBEYING
    modes = []
    for i, flags in enumerate([ELIGIBLE, ELIGIBLE, EXHAUSTED, ELIGIBLE, Flag(0)]):
        report = ack(1, 0, i * K, K, flags) if i % 2 == 0 else nack(1, i * K, K, 0, flags)
        tx.receive(report, 1e-6 * i)
        modes.append(tx.flow_state(1).cc_mode)
    assert modes == [EXEMPT, EXEMPT, OBEYING, EXEMPT, OBEYING]
    assert tx.flow_state(1).mode_changes == 4


def test_time_obeying_again_counts_only_after_the_exemption_began():
    """Obeying from the start is not obeying again; each later episode is, until the flow ends."""
    tx = sender()
    tx.open_flow(1, 4 * K, now=0.0)
    reports = [(1.0, ELIGIBLE), (2.0, EXHAUSTED), (2.5, ELIGIBLE), (4.0, EXHAUSTED)]
    for at, flags in reports:
        tx.receive(ack(1, 0, 0, 0, flags), at)
    state = tx.flow_state(1)
    assert (state.exempt_time, state.obeying_again_time) == (2.5, 0.5)
    tx.receive(ack(1, 4 * K, 0, 0, EXHAUSTED), 7.0)  # the last ACK ends the flow, obeying
    state = tx.flow_state(1)
    assert state.done and state.mode_changes == 4
    assert (state.exempt_time, state.obeying_again_time) == (2.5, 3.5)


def test_exempt_sender_ignores_cnps_and_trims_obeying_sender_cuts():
    tx = sender()
    tx.open_flow(1, 100 * K, now=0.0)
    tx.receive(ack(1, 0, 0, K, ELIGIBLE), 0.0)
    tx.receive(cnp(1), 1e-3)
    tx.receive(nack(1, K, K, 0, ELIGIBLE), 2e-3)
    state = tx.flow_state(1)
    assert (state.rate_bps, state.rate_cuts, state.cnps_ignored) == (10 * GBPS, 0, 1)
    tx.receive(nack(1, 2 * K, K, 0, EXHAUSTED), 3e-3)  # obeying again: the NACK cuts
    assert tx.flow_state(1).rate_cuts == 1
    tx.receive(cnp(1), 4e-3)
    assert tx.flow_state(1).rate_cuts == 2 and tx.flow_state(1).rate_bps < 10 * GBPS


def test_feedback_for_unknown_flows_or_malformed_changes_nothing():
    tx = sender()
    tx.open_flow(1, K, now=0.0)
    before = tx.flow_state(1)
    tx.receive(ack(9, K, 0, K), 0.0)
    tx.receive(b"\x11\x00", 0.0)
    tx.receive(ack(1, 0, 0, K)[:15], 0.0)
    assert tx.stats == SenderCounts(malformed=2, unknown_flow=1)
    assert tx.flow_state(1) == before


def test_open_flow_validation():
    tx = sender()
    with pytest.raises(ValueError, match="size"):
        tx.open_flow(1, 0, now=0.0)
    with pytest.raises(ValueError, match="data has"):
        tx.open_flow(1, 10, now=0.0, data=b"x")
    tx.open_flow(1, 10, now=0.0)
    with pytest.raises(ValueError, match="already open"):
        tx.open_flow(1, 10, now=0.0)


# -- DCQCN reaction point ----------------------------------------------------------


def params(**kw):
    return DcqcnParams(line_rate_bps=40 * GBPS, **kw)


def test_cut_uses_alpha_and_raises_it():
    r = DcqcnRate(params(), now=0.0)
    assert r.reduce(0.0)
    assert r.current == 20 * GBPS and r.target == 40 * GBPS
    g = 1 / 256
    assert r.alpha == pytest.approx((1 - g) * 1.0 + g)
    before, alpha = r.rate_at(60e-6), r.alpha
    assert before == pytest.approx(30 * GBPS)  # one timer event at 55 us: fast recovery
    assert r.reduce(60e-6)
    assert r.current == pytest.approx(before * (1 - alpha / 2)) and r.target == before


def test_alpha_decays_every_period_without_cnp():
    r = DcqcnRate(params(), now=0.0)
    r.reduce(0.0)
    a0 = r.alpha
    r.rate_at(10 * 55e-6 + 1e-9)
    assert r.alpha == pytest.approx(a0 * (1 - 1 / 256) ** 10)


def test_fast_recovery_then_additive_then_hyper_increase():
    p = params()
    r = DcqcnRate(p, now=0.0)
    r.reduce(0.0)
    rates = [r.rate_at(k * 55e-6 + 1e-9) for k in range(1, 9)]
    # fast recovery: halfway to the 40G target each period (F = 5 timer events)
    assert rates[0] == pytest.approx(30 * GBPS)
    assert rates[3] == pytest.approx(40 * GBPS - 20 * GBPS / 2**4)
    # then additive increase: the target grows by R_AI; the byte stage is 0 so never hyper
    assert r.target == pytest.approx(40 * GBPS)  # clamped at the line rate
    r2 = DcqcnRate(p, now=0.0)
    r2.reduce(0.0)
    r2.byte_stage = r2.timer_stage = 6  # both past F: hyper increase
    r2.target = 10 * GBPS
    r2._increase(0.0)
    assert r2.target == pytest.approx(10 * GBPS + p.rate_hai_bps * 1)


def test_byte_counter_triggers_increase_events():
    r = DcqcnRate(params(), now=0.0)
    r.reduce(0.0)
    r.on_sent(10_000_000, 1e-6)
    assert r.byte_stage == 1 and r.current == pytest.approx(30 * GBPS)


def test_rate_never_falls_below_min_rate():
    r = DcqcnRate(params(min_rate_bps=1 * GBPS), now=0.0)
    for k in range(200):
        r.reduce(k * 1e-4)
    assert r.current == 1 * GBPS


def test_time_scale_stretches_periods_and_rate_steps_follow_the_line_rate():
    p = DcqcnParams(line_rate_bps=40e6, time_scale=1000.0)
    assert p.rate(p.rate_ai_bps) == pytest.approx(40e3)  # 1/1000 of the line, as 40M of 40G
    assert p.byte_count(10_000_000) == 10_000_000  # 1/1000 of the rate for 1000x the time
    r = DcqcnRate(p, now=0.0)
    r.reduce(0.0)
    assert r.rate_at(55e-6 * 999) == pytest.approx(20e6)  # no timer event yet
    assert r.rate_at(55e-3 + 1e-9) == pytest.approx(30e6)
    assert p.cnp_interval == pytest.approx(50e-3)
    nic = DcqcnParams(line_rate_bps=40e6, time_scale=1000.0, profile="nic")
    assert nic.rate(nic.rate_ai_bps) == pytest.approx(5e3)  # 50M of 400G
    assert nic.cnp_interval == pytest.approx(4e-3)
    r = new_rate(nic, now=0.0)
    assert not r.reduce(1e-3)  # the first cut waits for the check, 4 us x 1000 later
    alpha = (1 - 1 / 256) ** 4  # four 1-us updates (x 1000) with no new CNP before the check
    assert r.rate_at(4.999e-3) == 40e6
    assert r.rate_at(5.001e-3) == pytest.approx(40e6 * (1 - alpha / 2))
    slow_link = DcqcnParams(line_rate_bps=40e6)
    assert slow_link.byte_count(10_000_000) == 10_000


def test_params_validation():
    with pytest.raises(ValueError, match="line_rate"):
        DcqcnParams(line_rate_bps=0)
    with pytest.raises(ValueError, match="time_scale"):
        DcqcnParams(line_rate_bps=1e9, time_scale=0)


def test_rto_follows_the_measured_round_trip_and_ignores_retransmissions():
    tx = sender(rto=1e-3, rto_max=1.0)
    tx.open_flow(1, 3 * K, now=0.0)
    tx.poll(0.0)
    tx.receive(ack(1, K, 0, K), 5e-3)  # one sample: srtt 5 ms, rttvar 2.5 ms
    state = tx.flow_state(1)
    assert state.srtt == pytest.approx(5e-3) and state.rto == pytest.approx(15e-3)
    later = [(t, h.seq, bool(h.flags & Flag.RETX)) for t, h, _ in drain(tx, until=40e-3)]
    # the two remaining segments left at once; unacknowledged, they time out after 15 ms
    assert [seq for t, seq, retx in later if not retx] == [K, 2 * K]
    first_retx = min(t for t, _, retx in later if retx)
    assert first_retx == pytest.approx(later[0][0] + 15e-3, abs=1e-6)
    # an ACK for a retransmitted segment gives no sample (Karn)
    tx.receive(ack(1, 2 * K, K, K), 0.5)
    assert tx.flow_state(1).srtt == pytest.approx(5e-3)


def test_flows_to_one_peer_share_their_round_trip_estimate():
    tx = sender(rto=1e-3, rto_max=1.0)
    tx.open_flow(1, K, now=0.0, peer="10.0.0.2")
    tx.poll(0.0)
    tx.receive(ack(1, K, 0, K), 20e-3)
    tx.open_flow(2, K, now=0.03, peer="10.0.0.2")
    tx.open_flow(3, K, now=0.03, peer="10.0.0.3")
    assert tx.flow_state(2).srtt == pytest.approx(20e-3)
    assert tx.flow_state(2).rto == pytest.approx(60e-3)
    assert tx.flow_state(3).srtt is None and tx.flow_state(3).rto == 1e-3
