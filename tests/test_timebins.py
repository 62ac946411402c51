"""TimeBins: bounded memory, exact totals, and parts of a step by hand."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from host_agent.timebins import TimeBins


def test_samples_fall_in_the_parts_of_the_interval():
    bins = TimeBins(origin=0.0, width=0.1, fields=2, bins=100)
    bins.add(0.5, 10, 1)  # first fifth of [0, 5)
    bins.add(1.2, 20, 2)  # second
    bins.add(4.9, 30, 3)  # last
    assert bins.split(0.0, 5.0, 5) == [[10, 1], [20, 2], [0, 0], [0, 0], [30, 3]]


def test_a_sample_past_the_last_bin_widens_every_bin_and_keeps_the_rest():
    bins = TimeBins(origin=0.0, width=1.0, fields=1, bins=4)
    bins.add(0.5, 1)
    bins.add(3.5, 2)
    bins.add(9.0, 4)  # index 9 needs a width of 4: bins [0,4) [4,8) [8,12) [12,16)
    assert bins.width == 4.0
    assert bins.totals() == [7]
    assert bins.split(0.0, 16.0, 4) == [[3], [0], [4], [0]]


def test_before_start_counts_first_after_end_counts_last():
    bins = TimeBins(origin=0.0, width=1.0, fields=1, bins=16)
    bins.add(1.5, 1)  # before the step's start at 4
    bins.add(14.5, 2)  # after its end at 9
    bins.add(6.2, 4)  # the middle fifth of [4, 9)
    assert bins.split(4.0, 9.0, 5) == [[1], [0], [4], [0], [2]]


def test_an_empty_histogram_and_bad_arguments():
    bins = TimeBins(origin=1.0, width=1e-6, fields=3)
    assert bins.split(1.0, 2.0, 5) == [[0, 0, 0]] * 5
    with pytest.raises(ValueError):
        bins.add(1.0, 1, 2)
    with pytest.raises(ValueError):
        TimeBins(origin=0.0, width=0.0, fields=1)


@given(
    st.lists(st.tuples(st.floats(0, 1e3, allow_nan=False), st.integers(0, 10**6)), max_size=200),
    st.integers(2, 64),
)
def test_totals_are_kept_exactly_whatever_the_widening(samples, nbins):
    bins = TimeBins(origin=0.0, width=1e-6, fields=1, bins=nbins)
    for t, v in samples:
        bins.add(t, v)
    total = sum(v for _, v in samples)
    assert bins.totals() == [total]
    assert sum(p[0] for p in bins.split(0.0, 1e3, 5)) == total
    assert len(bins._sums or []) in (0, nbins)
