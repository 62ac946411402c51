"""Egress queues and the per-port counters of the program.

Each egress port has a high and a low queue served in strict priority, with
the low queue's byte occupancy kept exactly (the P4 program's register), and a
line rate that paces transmission. Capacities stand in for the buffer BMv2
gives a queue; the trimming threshold (`data_queue_bytes`) is a table entry
and is checked by the pipeline before a frame gets here.
"""

from __future__ import annotations

import socket
from collections import deque
from dataclasses import dataclass, field

DEFAULT_LOW_CAPACITY = 16 << 20
DEFAULT_HIGH_CAPACITY = 4 << 20
CATCH_UP_S = 0.001
"""How far behind its schedule a paced port may fall and still send back to back."""


@dataclass(eq=False)
class EgressPort:
    number: int
    ifname: str
    sock: socket.socket | None = None
    rate_bps: int = 0
    """0: as fast as the socket takes frames."""
    low_capacity: int = DEFAULT_LOW_CAPACITY
    high_capacity: int = DEFAULT_HIGH_CAPACITY
    high: deque = field(default_factory=deque)
    low: deque = field(default_factory=deque)
    high_bytes: int = 0
    low_bytes: int = 0
    next_tx: float = 0.0

    def enqueue(self, frame: bytearray, high: bool) -> bool:
        """Queue a frame; False when its queue's buffer is full (tail drop)."""
        size = len(frame)
        if high:
            if self.high_bytes + size > self.high_capacity:
                return False
            self.high.append(frame)
            self.high_bytes += size
        else:
            if self.low_bytes + size > self.low_capacity:
                return False
            self.low.append(frame)
            self.low_bytes += size
        return True

    def dequeue(self) -> bytearray | None:
        """The next frame in strict priority, its bytes already off the occupancy."""
        if self.high:
            frame = self.high.popleft()
            self.high_bytes -= len(frame)
            return frame
        if self.low:
            frame = self.low.popleft()
            self.low_bytes -= len(frame)
            return frame
        return None


class PortCounters:
    """The program's indirect counters, indexed by egress port like the P4 arrays."""

    def __init__(self, size: int = 512):
        self.size = size
        self.tx_packets = [0] * size
        self.tx_bytes = [0] * size
        self.ce_marks = [0] * size
        self.trims = [0] * size
        self.drops = [0] * size
