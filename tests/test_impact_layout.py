"""A recorded byte range lands on exactly the tensor elements it covers, and comes back to itself."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from impact.layout import ELEMENT_BYTES, GradientLayout, TensorSlice, rescale

# 12 + 5 + 6 = 23 elements in 2 chunks: elements [0, 12) and [12, 23)
SHAPES = [("a", (3, 4)), ("b", (5,)), ("c", (2, 3))]


def test_a_range_maps_to_the_elements_and_tensors_it_covers_and_back():
    layout = GradientLayout.of(SHAPES, 2)
    assert layout.chunks == [(0, 12), (12, 11)]
    assert layout.chunk_bytes(1) == 44
    # bytes [8, 28) of chunk 1 are flat elements 14..18: b[2:5] then c[0:2]
    assert layout.byte_span(1, 8, 28) == (56, 76)
    assert layout.elements_of(1, 8, 28) == (14, 19)
    pieces = layout.tensor_slices(14, 19)
    assert pieces == [TensorSlice("b", 2, 5), TensorSlice("c", 0, 2)]
    assert [layout.chunk_range(p) for p in pieces] == [(1, 8, 20), (1, 20, 28)]
    # a range that ends inside a float32 touches that element too
    assert layout.elements_of(1, 9, 27) == (14, 19)
    assert layout.elements_of(0, 0, 4) == (0, 1)
    assert layout.tensor_slices(0, 1) == [TensorSlice("a", 0, 1)]


def test_slices_that_leave_their_chunk_or_tensor_are_refused():
    layout = GradientLayout.of(SHAPES, 2)
    with pytest.raises(ValueError, match="crosses the end of chunk 0"):
        GradientLayout.of(SHAPES, 3).chunk_range(TensorSlice("a", 6, 10))  # chunk 0 is [0, 8)
    with pytest.raises(ValueError, match="outside tensor b"):
        layout.chunk_range(TensorSlice("b", 0, 6))
    with pytest.raises(ValueError, match="outside chunk 1"):
        layout.byte_span(1, 0, 45)
    with pytest.raises(ValueError, match="cannot fill 4 chunks"):
        GradientLayout.of([("x", (3,))], 4)


@settings(deadline=None, max_examples=200)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    ranks=st.integers(2, 8),
    data=st.data(),
)
def test_any_element_range_of_a_chunk_round_trips_through_the_tensors(sizes, ranks, data):
    shapes = [(f"p{i}", (s,)) for i, s in enumerate(sizes)]
    if sum(sizes) < ranks:
        return
    layout = GradientLayout.of(shapes, ranks)
    chunk = data.draw(st.integers(0, ranks - 1))
    count = layout.chunks[chunk][1]
    first = data.draw(st.integers(0, count))
    stop = data.draw(st.integers(first, count))
    lo, hi = first * ELEMENT_BYTES, stop * ELEMENT_BYTES
    flat = layout.elements_of(chunk, lo, hi)
    pieces = layout.tensor_slices(*flat)
    assert sum(p.stop - p.start for p in pieces) == stop - first
    back = [layout.chunk_range(p) for p in pieces]
    assert all(c == chunk for c, _, _ in back)
    if back:
        assert back[0][1] == lo and back[-1][2] == hi
        assert all(a[2] == b[1] for a, b in itertools.pairwise(back))


@settings(deadline=None)
@given(
    src=st.integers(1, 10**6),
    dst=st.integers(1, 10**6),
    cuts=st.lists(st.floats(0, 1), min_size=1, max_size=8),
)
def test_rescaling_keeps_shares_and_tiling(src, dst, cuts):
    points = sorted({0, src, *(round(c * src) for c in cuts)})
    mapped = [rescale(a, b, src, dst) for a, b in itertools.pairwise(points)]
    assert mapped[0][0] == 0 and mapped[-1][1] == dst
    for (_, b), (c, _) in itertools.pairwise(mapped):
        assert b == c  # tiles stay tiles, disjoint stays disjoint
    for (lo, hi), (a, b) in zip(itertools.pairwise(points), mapped, strict=True):
        assert abs((b - a) / dst - (hi - lo) / src) <= 1 / dst
    assert rescale(3, 7, src + 7, src + 7) == (3, 7)
    with pytest.raises(ValueError):
        rescale(0, src + 1, src, dst)
