"""When within a step things happened, in bounded memory: a histogram whose bins widen as time goes.

The note compares the trims of the first and the last fifth of a step, but a
step's length is known only once it ends, and a per-packet log would grow with
the traffic. `TimeBins` keeps a fixed number of equal bins from an origin; a
sample past the last bin merges neighbouring bins (the width doubles, as often
as needed), so memory stays bounded whatever the run does and the resolution
stays within 2/bins of the span covered. `split` then shares the bins among
equal parts of any interval, each bin going whole to the part holding its
middle, so totals are kept exactly.
"""

from __future__ import annotations

import math

DEFAULT_BINS = 256


class TimeBins:
    """Sums of `fields` counters over time since `origin`."""

    __slots__ = ("_sums", "bins", "fields", "origin", "width")

    def __init__(self, origin: float, width: float, fields: int, bins: int = DEFAULT_BINS) -> None:
        if not (width > 0 and math.isfinite(width)):
            raise ValueError(f"bin width must be a positive finite number, got {width}")
        if fields < 1 or bins < 2:
            raise ValueError("need at least one field and two bins")
        self.origin = origin
        self.width = width
        self.fields = fields
        self.bins = bins
        self._sums: list[list[int]] | None = None
        """Per bin, the counters; allocated at the first sample (most steps of most hosts
        see no trim at all)."""

    def add(self, t: float, *values: int) -> None:
        """Add `values` (one per field) at time `t`; a time before the origin counts at it."""
        if len(values) != self.fields:
            raise ValueError(f"expected {self.fields} values, got {len(values)}")
        if self._sums is None:
            self._sums = [[0] * self.fields for _ in range(self.bins)]
        index = max(0, int((t - self.origin) / self.width))
        if index >= self.bins:
            factor = 1 << math.ceil(math.log2((index + 1) / self.bins))
            self._widen(factor)
            index //= factor
            index = min(index, self.bins - 1)  # float rounding at the very edge
        row = self._sums[index]
        for i, v in enumerate(values):
            row[i] += v

    def _widen(self, factor: int) -> None:
        sums = self._sums
        assert sums is not None
        merged = [[0] * self.fields for _ in range(self.bins)]
        for i, row in enumerate(sums):
            target = merged[i // factor]
            for k, v in enumerate(row):
                target[k] += v
        self._sums = merged
        self.width *= factor

    def totals(self) -> list[int]:
        if self._sums is None:
            return [0] * self.fields
        return [sum(row[k] for row in self._sums) for k in range(self.fields)]

    def split(self, start: float, end: float, parts: int) -> list[list[int]]:
        """Per part of [start, end) cut into `parts` equal pieces, the counters' sums.

        A bin goes whole to the part its middle falls in; bins before `start` count
        in the first part, bins after `end` in the last, so the parts add up to
        `totals()`."""
        if parts < 1:
            raise ValueError("need at least one part")
        out = [[0] * self.fields for _ in range(parts)]
        if self._sums is None:
            return out
        span = end - start
        for i, row in enumerate(self._sums):
            if not any(row):
                continue
            middle = self.origin + (i + 0.5) * self.width
            part = int((middle - start) / span * parts) if span > 0 else 0
            target = out[min(max(part, 0), parts - 1)]
            for k, v in enumerate(row):
                target[k] += v
        return out
