"""The operator queue with column blocks and runs behaves as a deque of rows under any sequence of operations."""

from __future__ import annotations

from collections import deque
from itertools import chain

from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.runtime.records import Block, RecordQueue, Run

row = st.tuples(st.just(1), st.integers(0, 50), st.integers(0, 50), st.integers(0, 10_000))
# A block's requests as runs: (record id, the values sharing it).
block = st.lists(st.tuples(st.integers(0, 10_000), st.lists(st.integers(0, 50), min_size=1, max_size=4)),
                 max_size=6)
ops = st.lists(st.one_of(
    st.tuples(st.just("append"), row),
    st.tuples(st.just("extend"), st.lists(row, max_size=5)),
    st.tuples(st.just("extendleft"), st.lists(row, max_size=5)),
    st.tuples(st.just("block"), block),
    # a source's batch: values with consecutive record ids from a start
    st.tuples(st.just("run"), st.tuples(st.integers(0, 10_000), st.lists(st.integers(0, 50), max_size=6))),
    st.tuples(st.just("take_columns"), st.integers(0, 12)),
    st.tuples(st.just("popleft"), st.none()),
    st.tuples(st.just("take"), st.integers(0, 12)),
    st.tuples(st.just("take_rows"), st.integers(0, 12)),
    st.tuples(st.just("clear"), st.none()),
), max_size=40)


def _rows(parts: list) -> list:
    return list(chain.from_iterable(p if type(p) is list else p.rows() for p in parts))


@settings(max_examples=400, deadline=None)
@given(ops)
def test_a_record_queue_is_a_fifo_of_rows(sequence):
    q, model = RecordQueue(), deque()
    for name, arg in sequence:
        if name == "append":
            q.append(arg)
            model.append(arg)
        elif name == "extend":
            q.extend(iter(arg))  # the engine extends with iterators (zip): the length is counted, not asked
            model.extend(arg)
        elif name == "extendleft":
            q.extendleft(reversed(arg))
            model.extendleft(reversed(arg))
        elif name == "block":
            values = [v for _, vs in arg for v in vs]
            q.append_block(1, values, [r for r, _ in arg], [len(vs) for _, vs in arg], [v % 7 for v in values])
            model.extend((1, v, v, r) for r, vs in arg for v in vs)
        elif name == "run":
            start, values = arg
            q.append_run(1, values, start)
            model.extend((1, v, None, start + i) for i, v in enumerate(values))
        elif name == "take_columns":
            want = [model.popleft() for _ in range(min(arg, len(model)))]
            cols = q.take_columns(arg)
            assert all(len(vs) == len(rs) > 0 for vs, rs in cols)
            assert list(chain.from_iterable(vs for vs, _ in cols)) == [r[1] for r in want]
            assert list(chain.from_iterable(rs for _, rs in cols)) == [r[3] for r in want]
        elif name == "popleft" and model:
            assert q[0] == model[0]
            assert q.popleft() == model.popleft()
        elif name == "take":
            parts = q.take(arg)
            assert all(type(p) is list or (type(p) in (Block, Run) and len(p)) for p in parts)
            for p in parts:  # a block's runs cover its values exactly, none empty
                if type(p) is Block:
                    rids, counts = p.runs()
                    assert len(rids) == len(counts) and min(counts) > 0 and sum(counts) == len(p)
                    assert p.groups_left() == [v % 7 for v in p.values_left()]  # the groups follow their values
            assert _rows(parts) == [model.popleft() for _ in range(min(arg, len(model)))]
        elif name == "take_rows":
            assert q.take_rows(arg) == [model.popleft() for _ in range(min(arg, len(model)))]
        elif name == "clear":
            q.clear()
            model.clear()
        assert len(q) == len(model) and bool(q) == bool(model)
        assert list(q) == list(model)


def test_a_run_is_its_batch_with_consecutive_ids_and_shares_its_values():
    values = ["a", "b", "c", "d", "e"]
    q = RecordQueue()
    first = 1 << 20
    q.append_run(2, values, first)
    q.append_run(3, values, first)  # a second successor of the same source: the same list, read only
    assert q.popleft() == (2, "a", None, first)
    (vs, rids), = q.take_columns(3)
    assert vs == ["b", "c", "d"] and rids == range(first + 1, first + 4)
    assert q.take_columns(3) == [(["e"], range(first + 4, first + 5)), (["a", "b"], range(first, first + 2))]
    assert values == ["a", "b", "c", "d", "e"] and len(q) == 3
