"""Aligned reading's pure parts (clasp/core/alignment.py): which partitions read in a turn, lowest event time
first, which pause, and how big a slice each reads."""

from __future__ import annotations

import math
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from clasp.core.alignment import slice_size, turn_order

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
