"""A sender and a receiver joined by an in-memory link that trims, reorders, drops and marks."""

import os
from fractions import Fraction

import pytest
from link import Impairments, Link

from host_agent.core import DcqcnParams, ForgiveReceiver, ForgiveSender, ReceiverPolicy

SIZE = 600_000


def run(policy, forward, *, gradient=True, critical=False, expected=SIZE, seed=0, reverse=None):
    # No zero bytes in what is sent, so a zero in the delivered copy marks a forgiven byte.
    data = bytes(b | 1 for b in os.urandom(SIZE))
    tx = ForgiveSender(DcqcnParams(line_rate_bps=10e9), rto=200e-6, rto_max=5e-3)
    rx = ForgiveReceiver(policy)
    rx.begin_step(1, critical=critical, expected_bytes=expected)
    rx.register_flow(1, step=1, gradient=gradient)
    tx.open_flow(1, SIZE, now=0.0, data=data)
    link = Link(tx, rx, forward=forward, reverse=reverse or Impairments(), seed=seed)
    link.run(until=5.0)
    return data, tx, rx, link


@pytest.mark.parametrize("seed", range(4))
def test_flow_completes_with_exactly_the_forgiven_bytes_missing(seed):
    lossy = Impairments(delay=5e-6, jitter=30e-6, trim=0.08, drop=0.03, ce=0.05)
    data, tx, rx, link = run(ReceiverPolicy(seed=seed), lossy, seed=seed)
    flow, step = rx.flow_state(1), rx.step_state(1)
    assert link.trimmed > 0 and link.dropped > 0
    assert tx.flow_state(1).done and flow.complete
    assert flow.received_bytes + flow.forgiven_bytes == SIZE
    assert 0 < step.forgiven <= step.budget
    assert step.forgiven * (1 - Fraction("0.1")) <= Fraction("0.1") * step.received
    assert step.outstanding == 0
    delivered = rx.payload(1)
    assert delivered.count(0) == step.forgiven
    assert all(b in (a, 0) for a, b in zip(data, delivered, strict=True))


def test_non_gradient_flow_delivers_every_byte_through_the_same_link():
    lossy = Impairments(delay=5e-6, jitter=30e-6, trim=0.1, drop=0.02, ce=0.05)
    data, tx, rx, _ = run(ReceiverPolicy(), lossy, gradient=False)
    assert rx.payload(1) == data
    assert rx.flow_state(1).forgiven_bytes == 0
    assert tx.flow_state(1).retransmitted_bytes > 0
    assert tx.flow_state(1).cc_mode == "obeying"


def test_lost_feedback_is_recovered_by_timeout():
    lossy = Impairments(delay=5e-6, trim=0.05)
    data, tx, rx, _ = run(
        ReceiverPolicy(forgive_prob=0.0), lossy, reverse=Impairments(delay=5e-6, drop=0.2)
    )
    assert rx.payload(1) == data
    assert tx.flow_state(1).done and tx.flow_state(1).rtos > 0


def test_exemption_keeps_the_rate_while_obeying_flow_is_cut():
    marks = Impairments(delay=5e-6, ce=0.3)
    _, exempt_tx, _, _ = run(ReceiverPolicy(), marks)
    _, obey_tx, _, _ = run(ReceiverPolicy(p_low=0.0, p_high=0.0), marks)
    exempt, obey = exempt_tx.flow_state(1), obey_tx.flow_state(1)
    assert exempt.rate_cuts == 0 and exempt.cnps_ignored > 0
    assert obey.rate_cuts > 0 and obey.cnps_ignored == 0
    assert exempt.finished < obey.finished


def test_critical_step_forgives_far_less():
    lossy = Impairments(delay=5e-6, trim=0.08)
    _, _, rx_crit, _ = run(ReceiverPolicy(), lossy, critical=True)
    _, _, rx_norm, _ = run(ReceiverPolicy(), lossy, critical=False)
    crit, norm = rx_crit.step_state(1), rx_norm.step_state(1)
    assert crit.forgiven <= crit.budget == int(0.005 * SIZE)
    assert norm.forgiven > crit.forgiven
