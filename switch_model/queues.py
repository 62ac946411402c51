"""Egress queues and the per-port counters of the program.

Each egress port has a high and a low queue served in strict priority, with
the low queue's byte occupancy kept exactly (the P4 program's register). Two
kinds of pacing apply, as on BMv2 plus a wire: each queue may be drained at a
rate in packets per second (BMv2's `set_queue_rate`, which the PTF suite uses
to build standing queues), and the port as a whole at a line rate in bits per
second. The highest-priority queue whose head is due goes first. Capacities
stand in for the buffer BMv2 gives a queue; the trimming threshold
(`data_queue_bytes`) is a table entry checked before a frame gets here.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_LOW_CAPACITY = 64 << 20
DEFAULT_HIGH_CAPACITY = 16 << 20
CATCH_UP_S = 0.001
"""How far behind its schedule a paced queue or port may fall and still send back to back."""
CATCH_UP_FRAMES = 8
"""A busy port may also make up this many full frames it owes: at the emulation's low
line rates a frame time is longer than CATCH_UP_S, and this process, sharing two cores
with a whole fabric, is sometimes not scheduled for tens of milliseconds. Without the
allowance each such stall costs the port capacity for good, and senders paced at the
same rate keep a standing queue behind it."""
FULL_FRAME_BITS = 9018 * 8
PRIO_LOW, PRIO_HIGH = 0, 1


@dataclass(eq=False)
class EgressPort:
    number: int
    ifname: str
    sock: socket.socket | None = None
    rate_bps: int = 0
    """Line rate; 0: as fast as the socket takes frames."""
    pps: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """Per priority (PRIO_LOW, PRIO_HIGH) drain rate in packets/s; 0: unpaced."""
    low_capacity: int = DEFAULT_LOW_CAPACITY
    high_capacity: int = DEFAULT_HIGH_CAPACITY
    high: deque = field(default_factory=deque)
    low: deque = field(default_factory=deque)
    """Entries are (frame, bytes as received): counters count a trimmed header at full size."""
    high_bytes: int = 0
    low_bytes: int = 0
    next_tx: float = 0.0
    next_queue: list[float] = field(default_factory=lambda: [0.0, 0.0])
    clock: Callable[[], float] = time.monotonic
    """The port's time source: the wall clock on real interfaces, a fabric's in virtual time."""

    def enqueue(self, frame: bytearray, received: int, high: bool) -> bool:
        """Queue a frame; False when its queue's buffer is full (tail drop)."""
        size = len(frame)
        if not self.high and not self.low:
            # An idle port earns no credit: its schedule restarts when traffic arrives,
            # so catching up (see CATCH_UP_FRAMES) only makes up for a busy port's delays.
            now = self.clock()
            self.next_tx = max(self.next_tx, now)
            self.next_queue = [max(t, now) for t in self.next_queue]
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

    def pop_due(self, now: float) -> tuple[bytearray, int] | None:
        """The next frame allowed to leave at `now` in strict priority, or None."""
        if self.rate_bps and self.next_tx > now:
            return None
        if self.high and self.next_queue[PRIO_HIGH] <= now:
            prio, queue = PRIO_HIGH, self.high
        elif self.low and self.next_queue[PRIO_LOW] <= now:
            prio, queue = PRIO_LOW, self.low
        else:
            return None
        frame, received = queue.popleft()
        if prio == PRIO_HIGH:
            self.high_bytes -= len(frame)
        else:
            self.low_bytes -= len(frame)
        pps = self.pps[prio]
        if pps:
            self.next_queue[prio] = max(self.next_queue[prio], now - CATCH_UP_S) + 1 / pps
        if self.rate_bps:
            slack = max(CATCH_UP_S, CATCH_UP_FRAMES * FULL_FRAME_BITS / self.rate_bps)
            self.next_tx = max(self.next_tx, now - slack) + len(frame) * 8 / self.rate_bps
        return frame, received

    def next_due(self) -> float | None:
        """When `pop_due` may next return a frame; None when both queues are empty."""
        heads = []
        if self.high:
            heads.append(self.next_queue[PRIO_HIGH])
        if self.low:
            heads.append(self.next_queue[PRIO_LOW])
        if not heads:
            return None
        return max(min(heads), self.next_tx if self.rate_bps else 0.0)


class PortCounters:
    """The program's indirect counters, indexed by egress port like the P4 arrays."""

    def __init__(self, size: int = 512):
        self.size = size
        self.tx_packets = [0] * size
        self.tx_bytes = [0] * size
        self.ce_marks = [0] * size
        self.trims = [0] * size
        self.drops = [0] * size
