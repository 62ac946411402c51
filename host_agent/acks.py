"""Delayed, coalesced ACKs between the receiver core and the wire.

The core answers every DATA packet with an ACK. Sending each one costs a
system call here and another at the sender, per data packet; holding a flow's
plain ACK for a few packets or a few tens of microseconds and sending only
the newest halves the per-packet work of a bulk flow. The newest ACK tells the
sender everything the held one did when its cumulative point covers the held
one's selective range; when it does not (a hole below), the held one goes out
first. A NACK, a CNP or an ACK echoing ECE releases the flow's held ACK ahead
of itself, so reports reach the sender in the order the core made them and the
latest report still wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from host_agent.wire import FTH_STRUCT, Flag, Opcode

ACK_EVERY = 32
"""Data packets acknowledged by one ACK at most."""
ACK_DELAY = 300e-6
"""Longest an ACK is held: far below any retransmission timeout."""

_ACK = int(Opcode.ACK)
_ECE = int(Flag.ECE)

Outgoing = tuple[bytes, Any]
"""A reply and where it goes (opaque here)."""


@dataclass(slots=True)
class _Held:
    reply: bytes
    dest: Any
    since: float
    count: int
    covers: int
    """End of the held ACK's selective range: a later cumulative point at or past it subsumes it."""


class AckCoalescer:
    def __init__(self, every: int = ACK_EVERY, delay: float = ACK_DELAY) -> None:
        self.every = every
        self.delay = delay
        self.coalesced = 0
        self.held: dict[int, _Held] = {}
        """Per flow, the ACK waiting to go out (empty when nothing waits)."""

    def offer(self, reply: bytes, dest: Any, now: float, flow_total: int) -> list[Outgoing]:
        """Take one reply from the core; return what must be sent now, in order."""
        _, flags, length, flow_id, rcv_nxt, lo = FTH_STRUCT.unpack_from(reply)
        previous = self.held.pop(flow_id, None)
        out: list[Outgoing] = []
        if reply[0] & 0x0F != _ACK or flags & _ECE:
            if previous is not None:
                out.append((previous.reply, previous.dest))
            out.append((reply, dest))
            return out
        since, count = now, 1
        if previous is not None:
            if rcv_nxt >= previous.covers:
                self.coalesced += 1
                since, count = previous.since, previous.count + 1
            else:
                out.append((previous.reply, previous.dest))
        if count >= self.every or rcv_nxt >= flow_total:
            out.append((reply, dest))
        else:
            self.held[flow_id] = _Held(reply, dest, since, count, lo + length)
        return out

    def due(self, now: float) -> list[Outgoing]:
        """Held ACKs whose delay has run out."""
        late = [fid for fid, h in self.held.items() if now - h.since >= self.delay]
        return [(h.reply, h.dest) for h in (self.held.pop(fid) for fid in late)]

    def deadline(self) -> float | None:
        if not self.held:
            return None
        return min(h.since for h in self.held.values()) + self.delay
