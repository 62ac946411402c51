"""The port model on a virtual clock: strict priority, a byte-counted data queue, one line rate.

`drive` is a complete engine in a dozen lines, the way a simulator drives the
port: it hands the port each arrival at its time and asks for departures at
exactly the times the port names. The packet loop (switch_model.dataplane)
drives the same class on the wall clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from switch_model.port import PRIO_HIGH, PRIO_LOW, EgressPort


@dataclass(frozen=True)
class Sent:
    time: float
    tag: int
    size: int
    high: bool


def frame(tag: int, size: int, high: bool) -> bytearray:
    out = bytearray(size)
    out[:4] = tag.to_bytes(4, "big")
    out[4] = high
    return out


def drive(
    port: EgressPort, arrivals: list[tuple[float, int, bool]]
) -> tuple[list[Sent], list[int]]:
    """Feed (time, size, high) arrivals; returns what left, when, and the tags refused."""
    pending = sorted(enumerate(arrivals), key=lambda item: item[1][0])
    sent, refused = [], []
    now = 0.0
    while pending or not port.empty:
        departure = port.next_departure()
        if departure is not None:
            departure = max(now, departure)  # a time already past means now
        if pending and (departure is None or pending[0][1][0] <= departure):
            tag, (now, size, high) = pending.pop(0)
            if not port.enqueue(frame(tag, size, high), size, high, now):
                refused.append(tag)
            continue
        now = departure
        item = port.dequeue(now)
        assert item is not None, "the port named a departure time and then sent nothing"
        out, received = item
        assert received == len(out)
        sent.append(Sent(now, int.from_bytes(out[:4], "big"), len(out), bool(out[4])))
    return sent, refused


def test_high_frames_go_first_and_every_frame_holds_the_one_line():
    port = EgressPort(1, rate_bps=1_000_000)  # 1250 bytes take 10 ms, 125 bytes 1 ms
    sent, _ = drive(port, [(0, 1250, False)] * 3 + [(0, 125, True)] * 2)
    assert [(s.tag, s.time) for s in sent] == [
        (3, 0),
        (4, pytest.approx(0.001)),
        (0, pytest.approx(0.002)),
        (1, pytest.approx(0.012)),
        (2, pytest.approx(0.022)),
    ]


def test_a_high_frame_waits_only_for_the_frame_on_the_wire():
    port = EgressPort(1, rate_bps=1_000_000)
    sent, _ = drive(
        port, [(0, 1250, False), (0, 1250, False), (0, 1250, False), (0.005, 125, True)]
    )
    assert [(s.tag, s.time) for s in sent] == [
        (0, 0),
        (3, pytest.approx(0.010)),
        (1, pytest.approx(0.011)),
        (2, pytest.approx(0.021)),
    ]


def test_the_data_queue_counts_bytes_and_refuses_what_does_not_fit():
    port = EgressPort(1, rate_bps=8_000, low_capacity=3000)
    for tag in range(3):
        assert port.enqueue(frame(tag, 1000, False), 1000, False, 0.0)
    assert port.low_bytes == 3000
    assert not port.enqueue(bytearray(1), 1, False, 0.0), "one byte over capacity"
    assert port.enqueue(frame(4, 58, True), 58, True, 0.0), "the high queue has its own buffer"
    assert (port.low_bytes, port.high_bytes) == (3000, 58)
    port.dequeue(0.0)  # the header goes first
    assert port.dequeue(0.0) is None, "the line is busy for 58 bytes' time"
    assert port.dequeue(port.next_departure())[0][:4] == (0).to_bytes(4, "big")
    assert port.low_bytes == 2000
    assert port.enqueue(frame(5, 1000, False), 1000, False, 0.5)


def test_per_priority_drain_rate_paces_one_queue_only():
    """BMv2's set_queue_rate: the low queue at 2 packets/s, the high queue unpaced."""
    port = EgressPort(1)
    port.pps[PRIO_LOW] = 2
    sent, _ = drive(port, [(0, 100, False)] * 3 + [(0.1, 58, True)])
    assert [(s.tag, s.time) for s in sent] == [
        (0, 0),
        (3, pytest.approx(0.1)),
        (1, pytest.approx(0.5)),
        (2, pytest.approx(1.0)),
    ]
    assert port.pps[PRIO_HIGH] == 0


def test_an_idle_port_earns_no_credit():
    port = EgressPort(1, rate_bps=1_000_000)
    sent, _ = drive(port, [(0, 1250, False), (1.0, 1250, False), (1.0, 1250, False)])
    assert [s.time for s in sent] == [0, 1.0, pytest.approx(1.01)]


def test_a_late_engine_sends_what_it_owes_back_to_back_within_the_allowance():
    port = EgressPort(1, rate_bps=80_000_000)  # a 1000-byte frame takes 100 us
    for tag in range(5):
        port.enqueue(frame(tag, 1000, False), 1000, False, 0.0)
    port.dequeue(0.0)
    late = 0.00035  # frames 1, 2 and 3 were due by then, frame 4 is not
    assert port.dequeue(late) is not None
    assert port.dequeue(late) is not None
    assert port.dequeue(late) is not None
    assert port.dequeue(late) is None, "only what was owed by `late`"


arrivals = st.lists(
    st.tuples(
        st.floats(0, 0.05, allow_nan=False),
        st.integers(58, 9018),
        st.booleans(),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(arrivals=arrivals, rate=st.sampled_from([1_000_000, 20_000_000, 1_000_000_000]))
def test_strict_priority_on_one_work_conserving_line(arrivals, rate):
    port = EgressPort(1, rate_bps=rate, low_capacity=40_000, high_capacity=20_000)
    sent, refused = drive(port, arrivals)
    assert len(sent) + len(refused) == len(arrivals)
    assert port.low_bytes == port.high_bytes == 0
    arrived = {tag: arrivals[tag][0] for tag in range(len(arrivals))}
    for queue in (True, False):
        order = [s.tag for s in sent if s.high is queue]
        assert order == sorted(order, key=lambda tag: (arrived[tag], tag)), "FIFO per queue"
    line_free = 0.0
    for i, s in enumerate(sent):
        waiting = [t for t in arrived if t not in refused and arrived[t] <= s.time]
        waiting = [t for t in waiting if t not in {x.tag for x in sent[:i]}]
        # work conserving: it leaves as soon as it is there and the line is free
        assert s.time == pytest.approx(max(line_free, arrived[s.tag]), abs=1e-9)
        # strict priority: data leaves only when no high frame is waiting
        if not s.high:
            assert not [t for t in waiting if arrivals[t][2]]
        line_free = s.time + s.size * 8 / rate
