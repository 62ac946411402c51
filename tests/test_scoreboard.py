from hypothesis import given
from hypothesis import strategies as st

from host_agent.core.scoreboard import AckedRanges, RangeMap, State

N = 64
ranges = st.tuples(st.integers(0, N - 1), st.integers(1, 16)).map(
    lambda t: (t[0], min(N, t[0] + t[1]))
)


@given(st.lists(st.tuples(ranges, st.sampled_from(list(State))), max_size=30))
def test_range_map_matches_a_byte_array(ops):
    model: list[State | None] = [None] * N
    rm = RangeMap()
    for (lo, hi), state in ops:
        rm.assign(lo, hi, state)
        model[lo:hi] = [state] * (hi - lo)
        flat: list[State | None] = [None] * N
        prev_end, prev_state = -1, None
        for s, e, stt in rm:
            assert s < e and s >= prev_end
            assert not (s == prev_end and stt == prev_state), "equal neighbours are merged"
            flat[s:e] = [stt] * (e - s)
            prev_end, prev_state = e, stt
        assert flat == model
        pieces = rm.pieces(0, N)
        assert [x for s, e, stt in pieces for x in [stt] * (e - s)] == model


def test_pop_settled_prefix_stops_at_requested():
    rm = RangeMap()
    rm.assign(10, 20, State.RECEIVED)
    rm.assign(20, 30, State.FORGIVEN)
    rm.assign(30, 40, State.REQUESTED)
    rm.assign(40, 50, State.RECEIVED)
    assert rm.pop_settled_prefix(0) == 0
    assert rm.pop_settled_prefix(10) == 30
    assert list(rm) == [(30, 40, State.REQUESTED), (40, 50, State.RECEIVED)]


@given(st.lists(ranges, max_size=30), st.lists(ranges, max_size=10))
def test_acked_ranges_match_a_byte_set(adds, probes):
    acked = AckedRanges()
    model: set[int] = set()
    for lo, hi in adds:
        fresh = acked.add(lo, hi)
        before = len(model)
        model.update(range(lo, hi))
        assert fresh == len(model) - before
        assert all(acked.contains(i) == (i in model) for i in range(N))
        assert acked.una == next(i for i in range(N + 1) if i not in model)
    for lo, hi in probes:
        gap = acked.first_gap(lo, hi)
        missing = [i for i in range(lo, hi) if i not in model]
        if not missing:
            assert gap is None
        else:
            a, b = gap
            assert a == missing[0]
            assert all(i not in model for i in range(a, b))
            assert b == hi or b in model
