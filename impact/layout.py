"""Where a recorded byte range lands in the model: which chunk bytes, which elements, which tensor.

The model's gradient is one flat float32 buffer (its parameters in order),
split into ring chunks by the same rule the workload uses. A recorded range
is an offset within a chunk of the run's gradient buffer; the run's chunk and
the model's chunk rarely have the same size, so offsets are rescaled chunk by
chunk, which keeps each range's share of its chunk (and is the identity when
the sizes agree). Pure Python: the tests of the mapping need no PyTorch.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from workload.plan import chunk_bounds

ELEMENT_BYTES = 4
"""float32."""


def rescale(lo: int, hi: int, from_bytes: int, to_bytes: int) -> tuple[int, int]:
    """[lo, hi) of a chunk of `from_bytes` as the same share of a chunk of `to_bytes`.

    Both ends round down, so ranges that tile a chunk still tile it, disjoint
    ranges stay disjoint, and the whole chunk maps to the whole chunk.
    """
    if not 0 <= lo <= hi <= from_bytes:
        raise ValueError(f"range [{lo}, {hi}) outside a chunk of {from_bytes} bytes")
    return lo * to_bytes // from_bytes, hi * to_bytes // from_bytes


@dataclass(frozen=True)
class TensorSlice:
    """Elements [start, stop) of one parameter tensor, in its row-major flat order."""

    name: str
    start: int
    stop: int


@dataclass(frozen=True)
class GradientLayout:
    """The model's flat gradient: named parameter tensors end to end, split into `ranks` chunks."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    ranks: int

    @classmethod
    def of(cls, named_shapes: Sequence[tuple[str, Sequence[int]]], ranks: int) -> GradientLayout:
        layout = cls(
            tuple(n for n, _ in named_shapes), tuple(tuple(s) for _, s in named_shapes), ranks
        )
        if layout.elements < ranks:
            raise ValueError(f"a model of {layout.elements} elements cannot fill {ranks} chunks")
        return layout

    @property
    def sizes(self) -> list[int]:
        return [prod(s) for s in self.shapes]

    @property
    def offsets(self) -> list[int]:
        """Flat element offset of each tensor."""
        out, pos = [], 0
        for size in self.sizes:
            out.append(pos)
            pos += size
        return out

    @property
    def elements(self) -> int:
        return sum(self.sizes)

    @property
    def chunks(self) -> list[tuple[int, int]]:
        """(first element, element count) of each chunk: the workload's rule, over elements."""
        return chunk_bounds(self.elements, self.ranks)

    def chunk_bytes(self, chunk: int) -> int:
        return self.chunks[chunk][1] * ELEMENT_BYTES

    def byte_span(self, chunk: int, lo: int, hi: int) -> tuple[int, int]:
        """Bytes [lo, hi) of `chunk` as bytes of the whole flat buffer."""
        if not 0 <= lo <= hi <= self.chunk_bytes(chunk):
            raise ValueError(f"range [{lo}, {hi}) outside chunk {chunk}")
        base = self.chunks[chunk][0] * ELEMENT_BYTES
        return base + lo, base + hi

    def elements_of(self, chunk: int, lo: int, hi: int) -> tuple[int, int]:
        """Flat elements [first, stop) that bytes [lo, hi) of `chunk` touch, partly or whole."""
        a, b = self.byte_span(chunk, lo, hi)
        if a == b:
            return a // ELEMENT_BYTES, a // ELEMENT_BYTES
        return a // ELEMENT_BYTES, -(-b // ELEMENT_BYTES)

    def tensor_slices(self, first: int, stop: int) -> list[TensorSlice]:
        """Flat elements [first, stop) as slices of the named tensors they lie in."""
        if not 0 <= first <= stop <= self.elements:
            raise ValueError(f"elements [{first}, {stop}) outside a model of {self.elements}")
        offsets, sizes = self.offsets, self.sizes
        out = []
        i = max(bisect_right(offsets, first) - 1, 0)
        pos = first
        while pos < stop:
            end = min(stop, offsets[i] + sizes[i])
            if end > pos:
                out.append(TensorSlice(self.names[i], pos - offsets[i], end - offsets[i]))
            pos = end
            i += 1
        return out

    def chunk_range(self, piece: TensorSlice) -> tuple[int, int, int]:
        """(chunk, lo, hi): the inverse of `elements_of` then `tensor_slices` for one slice.

        The slice must lie within one chunk; the bytes are those of its elements.
        """
        i = self.names.index(piece.name)
        if not 0 <= piece.start <= piece.stop <= self.sizes[i]:
            raise ValueError(f"{piece} outside tensor {piece.name} of {self.sizes[i]} elements")
        first = self.offsets[i] + piece.start
        stop = self.offsets[i] + piece.stop
        starts = [c for c, _ in self.chunks]
        chunk = bisect_right(starts, first) - 1
        begin, count = self.chunks[chunk]
        if stop > begin + count:
            raise ValueError(f"{piece} crosses the end of chunk {chunk}")
        return chunk, (first - begin) * ELEMENT_BYTES, (stop - begin) * ELEMENT_BYTES
