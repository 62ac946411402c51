"""Two protocol cores joined by an in-memory link in virtual time.

The forward direction can trim (cut DATA to its FTH and set TRIMMED), drop,
CE-mark and reorder; the reverse direction carries feedback and can drop it.
All randomness comes from one seeded stream, so every run is repeatable.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from common.wire import FTH_LEN, Flag
from host_agent.core import ForgiveReceiver, ForgiveSender


@dataclass
class Impairments:
    delay: float = 10e-6
    jitter: float = 0.0
    trim: float = 0.0
    drop: float = 0.0
    ce: float = 0.0


@dataclass
class Link:
    tx: ForgiveSender
    rx: ForgiveReceiver
    forward: Impairments = field(default_factory=Impairments)
    reverse: Impairments = field(default_factory=Impairments)
    seed: int = 0
    now: float = 0.0
    trimmed: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._events: list[tuple[float, int, str, bytes, bool]] = []
        self._order = itertools.count()

    def _put(self, direction: str, packet: bytes, imp: Impairments) -> None:
        r = self.rng
        if r.random() < imp.drop:
            self.dropped += 1
            return
        ce = False
        if direction == "fwd":
            if r.random() < imp.trim:
                packet = packet[:1] + bytes([packet[1] | Flag.TRIMMED]) + packet[2:FTH_LEN]
                self.trimmed += 1
            ce = r.random() < imp.ce
        at = self.now + imp.delay + r.random() * imp.jitter
        heapq.heappush(self._events, (at, next(self._order), direction, packet, ce))

    def run(self, until: float = 10.0, max_events: int = 2_000_000) -> None:
        for _ in range(max_events):
            for pkt in self.tx.poll(self.now):
                self._put("fwd", pkt, self.forward)
            for reply in self.rx.poll(self.now):
                self._put("rev", reply, self.reverse)
            deadlines = (self.tx.next_deadline(), self.rx.next_deadline())
            arrival = self._events[0][0] if self._events else None
            candidates = [t for t in (*deadlines, arrival) if t is not None]
            if not candidates:
                return
            self.now = max(self.now, min(candidates))
            if self.now > until:
                return
            while self._events and self._events[0][0] <= self.now:
                _, _, direction, packet, ce = heapq.heappop(self._events)
                if direction == "fwd":
                    for reply in self.rx.receive(packet, ce, self.now):
                        self._put("rev", reply, self.reverse)
                else:
                    self.tx.receive(packet, self.now)
        raise AssertionError("link did not go idle within max_events")
