"""One egress port as a pure state machine: strict priority, a byte-counted data queue, one line rate.

A switch ASIC's port serves its queues in strict priority onto one wire: the
high queue (transport control and trimmed headers) always goes first, the low
(data) queue gets what is left, and every frame of either queue holds the wire
for its own length at the port's line rate. This class is that port and
nothing else: it has no socket and no clock. An engine calls `enqueue(...,
now)` when the pipeline admits a frame, and `dequeue(now)` once
`next_departure()` has come; the model's packet loop does so on
`time.monotonic()`, a simulator on its virtual clock, the unit tests on plain
numbers, and all of them get the same order and timing.

The low queue's byte count is the P4 program's `low_queue_occupancy` register:
the pipeline's admission decisions read it, `enqueue` adds a frame to it and
`dequeue` takes the frame off as it leaves (the program's `release_low`).

Besides the line rate, each queue may be drained at a rate in packets per
second: BMv2's `set_queue_rate`, which the PTF suite uses on both targets to
hold a standing queue. The capacities stand in for the buffer a queue has;
the trimming threshold (`data_queue_bytes`) is a table entry the pipeline
checks before a frame gets here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

PRIO_LOW: Final = 0
"""The data queue. BMv2's priority queueing serves the highest value first."""
PRIO_HIGH: Final = 1
"""Transport control and trimmed headers."""
DEFAULT_LOW_CAPACITY: Final = 64 << 20
DEFAULT_HIGH_CAPACITY: Final = 16 << 20
CATCH_UP_S: Final = 0.001
"""How far behind its schedule a paced queue or port may fall and still send back to back.
An engine that calls on time (a simulator) never falls behind, so this only matters to
one that cannot (the packet loop, scheduled by the operating system)."""
CATCH_UP_FRAMES: Final = 8
"""A busy port may also make up this many full frames it owes: at the emulation's low
line rates a frame time is longer than CATCH_UP_S, and the packet loop, sharing two cores
with a whole fabric, is sometimes not scheduled for tens of milliseconds. Without the
allowance each such stall costs the port capacity for good, and senders paced at the
same rate keep a standing queue behind it."""
JUMBO_FRAME_BYTES: Final = 9018
"""The longest frame a port carries: a 9000-byte MTU, the Ethernet header and a VLAN tag."""
FULL_FRAME_BITS: Final = JUMBO_FRAME_BYTES * 8


@dataclass(eq=False, slots=True)
class EgressPort:
    number: int
    rate_bps: int = 0
    """Line rate shared by both queues; 0: unpaced (as fast as the engine sends)."""
    pps: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """Per priority (PRIO_LOW, PRIO_HIGH) drain rate in packets/s; 0: unpaced."""
    low_capacity: int = DEFAULT_LOW_CAPACITY
    high_capacity: int = DEFAULT_HIGH_CAPACITY
    high: deque[tuple[bytearray, int]] = field(default_factory=deque)
    low: deque[tuple[bytearray, int]] = field(default_factory=deque)
    """Entries are (frame, bytes as received): counters count a trimmed header at full size."""
    high_bytes: int = 0
    low_bytes: int = 0
    line_free: float = 0.0
    """When the wire may take the next frame (with a line rate)."""
    queue_due: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """Per priority, when its drain rate lets its next frame go (with a pps rate)."""

    def enqueue(self, frame: bytearray, received: int, high: bool, now: float) -> bool:
        """Queue a frame; False when its queue's buffer is full (tail drop)."""
        size = len(frame)
        if not self.high and not self.low:
            # An idle port earns no credit: its schedule restarts when traffic arrives,
            # so catching up (see CATCH_UP_FRAMES) only makes up for a busy port's delays.
            if self.line_free < now:
                self.line_free = now
            due = self.queue_due
            if due[0] < now:
                due[0] = now
            if due[1] < now:
                due[1] = now
        if high:
            if self.high_bytes + size > self.high_capacity:
                return False
            self.high.append((frame, received))
            self.high_bytes += size
        else:
            if self.low_bytes + size > self.low_capacity:
                return False
            self.low.append((frame, received))
            self.low_bytes += size
        return True

    def dequeue(self, now: float) -> tuple[bytearray, int] | None:
        """The frame that leaves at `now` in strict priority, or None when none may yet."""
        rate = self.rate_bps
        if rate and self.line_free > now:
            return None
        due = self.queue_due
        if self.high and due[PRIO_HIGH] <= now:
            prio = PRIO_HIGH
            frame, received = self.high.popleft()
            self.high_bytes -= len(frame)
        elif self.low and due[PRIO_LOW] <= now:
            prio = PRIO_LOW
            frame, received = self.low.popleft()
            self.low_bytes -= len(frame)
        else:
            return None
        pps = self.pps[prio]
        if pps:
            due[prio] = max(due[prio], now - CATCH_UP_S) + 1 / pps
        if rate:
            # The wire's schedule, but never more than the catch-up allowance behind `now`.
            slack = CATCH_UP_FRAMES * FULL_FRAME_BITS / rate
            earliest = now - (slack if slack > CATCH_UP_S else CATCH_UP_S)
            free = self.line_free
            self.line_free = (free if free >= earliest else earliest) + len(frame) * 8 / rate
        return frame, received

    def next_departure(self) -> float | None:
        """When `dequeue` may next return a frame; None when both queues are empty."""
        due = self.queue_due
        if self.high:
            head = min(due[PRIO_HIGH], due[PRIO_LOW]) if self.low else due[PRIO_HIGH]
        elif self.low:
            head = due[PRIO_LOW]
        else:
            return None
        if self.rate_bps and self.line_free > head:
            return self.line_free
        return head

    @property
    def empty(self) -> bool:
        return not self.high and not self.low
