"""Delayed, coalesced ACKs: the endpoint's rule for which replies wait and which go at once.

The core answers every DATA packet with an ACK. Sending each one costs a
system call here and another at the sender, per data packet; holding a flow's
plain ACK for a few packets or a few tens of microseconds and sending only
the newest halves the per-packet work of a bulk flow.

The rules, in the order they are applied to each reply of the core:

| reply | what happens |
|---|---|
| NACK or CNP | the flow's held ACK goes first, then the reply, at once |
| ACK echoing ECE | the same: congestion is news the sender needs now |
| ACK whose ELIGIBLE/EXHAUSTED differ from the last report sent on the flow | the same: the sender's mode follows the latest report, so a mode change is never delayed |
| ACK whose cumulative point covers the held ACK's selective range | replaces the held ACK (coalesced) |
| any other ACK | the held ACK goes first; this one is held |
| a held ACK that is the flow's last, or the `every`-th coalesced | sent at once |
| a held ACK older than `delay` | sent at the next timer |

So reports reach the sender in the order the core made them and the latest
report still wins. `delay` is on the run's clock: an emulation running
`time_scale` times slower holds ACKs that much longer.
"""

from __future__ import annotations

import heapq
from typing import Any, Final

from common.wire import Flag, Opcode, peek

ACK_EVERY: Final = 32
"""Data packets acknowledged by one ACK at most."""
ACK_DELAY: Final = 300e-6
"""Longest an ACK is held at time scale 1, unless the first timeout is short (below)."""
ACK_DELAY_PER_RTO: Final = 4
"""An ACK is held at most a quarter of the first retransmission timeout."""

_ACK: Final = int(Opcode.ACK)
_HEAP_SLACK: Final = 64
"""Stale entries `AckCoalescer._since` may gather beyond twice the ACKs held before it is
rebuilt from them."""
_ECE: Final = int(Flag.ECE)
_MODE: Final = int(Flag.ELIGIBLE | Flag.EXHAUSTED)

Outgoing = tuple[bytes, Any]
"""A reply and where it goes (opaque here)."""


class _Held:
    """An ACK held back for coalescing (plain, not a dataclass: common.native)."""

    def __init__(self, reply: bytes, dest: Any, since: float, count: int, covers: int) -> None:
        self.reply = reply
        self.dest = dest
        self.since = since
        self.count = count
        self.covers = covers
        """End of the held ACK's selective range: a later cumulative point at or past it
        subsumes it."""


class AckCoalescer:
    def __init__(self, every: int = ACK_EVERY, delay: float = ACK_DELAY) -> None:
        if every < 1 or delay < 0:
            raise ValueError(f"need every >= 1 and delay >= 0, got {every}, {delay}")
        self.every = every
        self.delay = delay
        self.coalesced = 0
        self.held: dict[int, _Held] = {}
        """Per flow, the ACK waiting to go out (empty when nothing waits)."""
        self._since: list[tuple[float, int]] = []
        """Heap of (since, flow) of the held ACKs, entries of ACKs gone since left in place:
        `deadline` runs after every event a host handles and reads its head, not every held
        ACK (a receiver of many flows at once holds one per flow)."""
        self._reported: dict[int, int] = {}
        """Per flow, the ELIGIBLE/EXHAUSTED bits of the last ACK or NACK sent (0 before any)."""

    def offer(self, reply: bytes, dest: Any, now: float, flow_total: int) -> list[Outgoing]:
        """Take one reply from the core; return what must be sent now, in order."""
        opcode, flags, length, flow_id, rcv_nxt, lo = peek(reply)
        previous = self.held.pop(flow_id, None)
        out: list[Outgoing] = []
        mode = flags & _MODE
        if opcode != _ACK or flags & _ECE or mode != self._reported.get(flow_id, 0):
            if previous is not None:
                out.append((previous.reply, previous.dest))
            out.append((reply, dest))
            if opcode != Opcode.CNP:
                self._reported[flow_id] = mode
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
            if count == 1:
                self._push(since, flow_id)
        return out

    def _push(self, since: float, flow_id: int) -> None:
        heap = self._since
        if len(heap) > 2 * len(self.held) + _HEAP_SLACK:  # a driver that never asks
            heap[:] = [(h.since, f) for f, h in self.held.items() if f != flow_id]
            heapq.heapify(heap)
        heapq.heappush(heap, (since, flow_id))

    def due(self, now: float) -> list[Outgoing]:
        """Held ACKs whose delay has run out."""
        late = [fid for fid, h in self.held.items() if h.since + self.delay <= now]
        return [(h.reply, h.dest) for h in (self.held.pop(fid) for fid in late)]

    def deadline(self) -> float | None:
        held, heap = self.held, self._since
        while heap:
            since, flow_id = heap[0]
            h = held.get(flow_id)
            if h is not None and h.since == since:
                return since + self.delay
            heapq.heappop(heap)  # sent, forgotten or held anew since
        return None

    def forget(self, flow_id: int) -> None:
        """Drop what is kept about a flow whose receive state is gone (its held ACK goes too)."""
        self.held.pop(flow_id, None)
        self._reported.pop(flow_id, None)
