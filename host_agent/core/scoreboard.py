"""Byte-range bookkeeping shared by the receiver's scoreboard and the sender's acknowledgements.

Both sides hold a handful of disjoint ranges per flow above a cumulative point,
so sorted parallel lists with bisect beat any tree here.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from enum import IntEnum
from typing import Final


class State(IntEnum):
    """Receiver-side state of a byte range above rcv_nxt (the note's scoreboard values).

    The note's Requested splits in two here: OUTSTANDING is Requested and already
    counted in its step's `outstanding`; REQUESTED is Requested without that count
    (not gradient, or no loss budget open when it was trimmed). Counting the split
    keeps `outstanding` exact: a range is added once and taken off once.
    """

    REQUESTED = 0
    OUTSTANDING = 1
    FORGIVEN = 2
    RECEIVED = 3


SETTLED: Final = (State.FORGIVEN, State.RECEIVED)


class RangeMap:
    """Disjoint half-open ranges [start, end) each carrying a State; absent bytes have none."""

    __slots__ = ("_ends", "_starts", "_states")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._states: list[State] = []

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __iter__(self) -> Iterator[tuple[int, int, State]]:
        return iter(zip(self._starts, self._ends, self._states, strict=True))

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int, State | None]]:
        """Cover [lo, hi) with (start, end, state) pieces; gaps come back with state None."""
        out: list[tuple[int, int, State | None]] = []
        starts, ends, states = self._starts, self._ends, self._states
        i = bisect_right(starts, lo) - 1
        if i < 0 or ends[i] <= lo:
            i += 1
        pos = lo
        n = len(starts)
        while pos < hi:
            if i < n and starts[i] <= pos:
                end = min(ends[i], hi)
                out.append((pos, end, states[i]))
                pos = end
                i += 1
            else:
                end = min(starts[i], hi) if i < n else hi
                out.append((pos, end, None))
                pos = end
        return out

    def assign(self, lo: int, hi: int, state: State) -> None:
        """Set [lo, hi) to `state`, splitting neighbours and merging equal ones."""
        if lo >= hi:
            return
        starts, ends, states = self._starts, self._ends, self._states
        i = bisect_right(starts, lo) - 1
        if i < 0 or ends[i] <= lo:
            i += 1
        j = i
        new_s, new_e, new_st = [], [], []
        # keep the left part of a range that begins before lo
        if j < len(starts) and starts[j] < lo:
            new_s.append(starts[j])
            new_e.append(lo)
            new_st.append(states[j])
        while j < len(starts) and starts[j] < hi:
            j += 1
        tail = None
        if j > i and ends[j - 1] > hi:
            tail = (hi, ends[j - 1], states[j - 1])
        new_s.append(lo)
        new_e.append(hi)
        new_st.append(state)
        if tail:
            new_s.append(tail[0])
            new_e.append(tail[1])
            new_st.append(tail[2])
        starts[i:j] = new_s
        ends[i:j] = new_e
        states[i:j] = new_st
        self._merge_around(max(i - 1, 0), min(i + len(new_s) + 1, len(starts)))

    def _merge_around(self, a: int, b: int) -> None:
        starts, ends, states = self._starts, self._ends, self._states
        k = a
        while k < b - 1 and k < len(starts) - 1:
            if ends[k] == starts[k + 1] and states[k] == states[k + 1]:
                ends[k] = ends[k + 1]
                del starts[k + 1], ends[k + 1], states[k + 1]
                b -= 1
            else:
                k += 1

    def pop_settled_prefix(self, point: int) -> int:
        """Advance: drop settled ranges that start at `point`; return the new cumulative point."""
        starts, ends, states = self._starts, self._ends, self._states
        k = 0
        while k < len(starts) and starts[k] == point and states[k] in SETTLED:
            point = ends[k]
            k += 1
        if k:
            del starts[:k], ends[:k], states[:k]
        return point

    def count(self, state: State) -> int:
        return sum(e - s for s, e, st in self if st == state)


class AckedRanges:
    """Bytes a sender knows are settled: everything below `una`, plus disjoint ranges above it."""

    __slots__ = ("_ends", "_starts", "una")

    def __init__(self) -> None:
        self.una = 0
        self._starts: list[int] = []
        self._ends: list[int] = []

    def add(self, lo: int, hi: int) -> int:
        """Mark [lo, hi) settled; return how many bytes were newly settled."""
        if hi <= self.una:
            return 0
        lo = max(lo, self.una)
        starts, ends = self._starts, self._ends
        i = bisect_right(ends, lo - 1)  # first range that ends at or after lo
        j = i
        covered = 0
        new_lo, new_hi = lo, hi
        while j < len(starts) and starts[j] <= hi:
            new_lo = min(new_lo, starts[j])
            new_hi = max(new_hi, ends[j])
            covered += (
                min(ends[j], hi) - max(starts[j], lo) if ends[j] > lo and starts[j] < hi else 0
            )
            j += 1
        starts[i:j] = [new_lo]
        ends[i:j] = [new_hi]
        if starts[0] <= self.una:
            self.una = max(self.una, ends[0])
            del starts[0], ends[0]
        return (hi - lo) - covered

    def contains(self, pos: int) -> bool:
        if pos < self.una:
            return True
        i = bisect_right(self._starts, pos) - 1
        return i >= 0 and self._ends[i] > pos

    def first_gap(self, lo: int, hi: int) -> tuple[int, int] | None:
        """The first unsettled subrange of [lo, hi), or None if all of it is settled."""
        lo = max(lo, self.una)
        starts, ends = self._starts, self._ends
        i = bisect_right(starts, lo) - 1
        if i >= 0 and ends[i] > lo:
            lo = ends[i]
        i += 1
        if lo >= hi:
            return None
        gap_end = min(starts[i], hi) if i < len(starts) else hi
        return lo, gap_end
