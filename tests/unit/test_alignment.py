"""Aligned reading's pure parts (clasp/core/alignment.py): which partitions read in a turn, lowest event time
first, which pause, and how big a slice each reads."""

from __future__ import annotations

import math
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from clasp.core.alignment import merged, slice_size, turn_order

marks = st.dictionaries(st.text(min_size=1, max_size=3),
                        st.one_of(st.just(-math.inf), st.floats(-1e6, 1e6, allow_nan=False)), max_size=8)
drifts = st.one_of(st.none(), st.floats(0, 1e4, allow_nan=False))


@given(marks, drifts)
def test_the_lowest_reads_first_and_only_those_further_ahead_than_the_drift_pause(m, drift):
    order = turn_order(m, drift)
    assert len(set(order)) == len(order) and set(order) <= set(m)
    assert [m[p] for p in order] == sorted(m[p] for p in order)
    if not m:
        assert order == []
        return
    lowest = min(m.values())
    assert order and m[order[0]] == lowest  # the lowest never pauses: a turn always reads something
    for p, w in m.items():
        assert (p in order) == (drift is None or w <= lowest + drift)


@given(marks)
def test_ties_keep_the_partitions_order(m):
    order = turn_order(m)
    for a, b in pairwise(order):
        if m[a] == m[b]:
            assert list(m).index(a) < list(m).index(b)


@given(st.integers(1, 100_000), st.integers(0, 64))
def test_a_pass_of_slices_fills_the_room_and_no_more_than_a_record_a_reader_over(room, readers):
    size = slice_size(room, readers)
    n = max(1, readers)
    assert size >= 1
    assert size * n >= room
    assert (size - 1) * n < room


times = st.one_of(st.integers(-1000, 1000), st.floats(-1e3, 1e3, allow_nan=False))


@given(st.lists(st.lists(times, max_size=30), max_size=6))
def test_a_merge_keeps_every_slices_order_and_puts_sorted_slices_in_time_order(slices):
    tagged = [[(t, i, j) for j, t in enumerate(s)] for i, s in enumerate(slices)]
    out = merged(tagged, lambda r: r[0])
    assert sorted(out, key=lambda r: (r[1], r[2])) == [r for s in tagged for r in s]  # every record, once
    for i in range(len(tagged)):
        assert [r for r in out if r[1] == i] == tagged[i]  # no slice reordered
    # Each record's place, its slice's running maximum, never falls along the merge.
    places = [max(r[0] for r in tagged[i][:j + 1]) for _, i, j in out]
    assert all(a <= b for a, b in pairwise(places))
    if all(all(a <= b for a, b in pairwise(s)) for s in slices):
        assert [r[0] for r in out] == sorted(t for s in slices for t in s)


def test_a_merge_with_a_time_it_cannot_compare_keeps_the_order_read():
    slices = [[(3, "a"), (1, "b")], [(2, "c"), ("x", "d")], [(float("nan"), "e")]]
    assert merged(slices, lambda r: r[0]) == [r for s in slices for r in s]
    lead = [[(float("nan"), "a"), (1, "b")], [(0, "c")]]  # a running maximum from a NaN stays NaN
    assert merged(lead, lambda r: r[0]) == [r for s in lead for r in s]
    later = [[(1, "a"), (float("nan"), "b")], [(0, "c")]]  # a later NaN is not above the maximum: kept in place
    assert merged(later, lambda r: r[0]) == [(0, "c"), (1, "a"), later[0][1]]
    assert merged([], lambda r: r) == [] and merged([[5, 1]], lambda r: r) == [5, 1]
