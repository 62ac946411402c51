"""Random and truncated byte strings into both cores never raise and change nothing."""

import contextlib

from helpers import ack, cnp, data, nack, trim
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from common.wire import MalformedPacket, decode
from host_agent.core import DcqcnParams, ForgiveReceiver, ForgiveSender, ReceiverPolicy


def valid(raw: bytes) -> bool:
    with contextlib.suppress(MalformedPacket):
        decode(raw)
        return True
    return False


def receiver():
    rx = ForgiveReceiver(ReceiverPolicy())
    rx.begin_step(1, critical=False, expected_bytes=100_000)
    rx.register_flow(7, step=1, gradient=True)
    rx.receive(data(7, 0, 1000, 100_000), False, 0.0)
    rx.receive(trim(7, 2000, 1000, 100_000), False, 0.0)
    return rx


def sender():
    tx = ForgiveSender(DcqcnParams(line_rate_bps=1e9))
    tx.open_flow(7, 100_000, now=0.0)
    tx.poll(0.0)
    return tx


def snapshot(core):
    if isinstance(core, ForgiveReceiver):
        return (core.flow_state(7), core.step_state(1), core.flow_ranges(7), core.payload(7))
    return (core.flow_state(7), core.next_deadline())


VALID = [
    data(7, 0, 1000, 100_000),
    trim(7, 4096, 4096, 100_000),
    ack(7, 4096, 0, 4096),
    nack(7, 0, 4096, 0),
    cnp(7),
]


@settings(max_examples=300)
@given(
    st.one_of(
        st.binary(max_size=80),
        st.sampled_from(VALID).flatmap(lambda v: st.integers(0, len(v) - 1).map(lambda n: v[:n])),
    )
)
def test_garbage_never_raises_and_changes_nothing(raw):
    assume(not valid(raw))
    rx, tx = receiver(), sender()
    rx_before, tx_before = snapshot(rx), snapshot(tx)
    assert rx.receive(raw, True, 1.0) == []
    tx.receive(raw, 1.0)
    assert snapshot(rx) == rx_before and snapshot(tx) == tx_before
    assert rx.stats.malformed == 1 and tx.stats.malformed == 1


@settings(max_examples=200)
@given(st.binary(min_size=16, max_size=80), st.booleans())
def test_any_bytes_at_all_never_raise(raw, ce):
    rx, tx = receiver(), sender()
    rx.receive(raw, ce, 1.0)
    tx.receive(raw, 1.0)
    tx.poll(2.0)
