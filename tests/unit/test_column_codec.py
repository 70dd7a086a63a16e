"""A `cols` message's values columns of strings travel joined into one string (`joined_columns`) and are split
back on receipt (`open_columns`): what the receiver validates and queues is exactly what the sender batched,
in order and in number, whatever the strings hold; anything else travels as it is."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core import protocol

words = st.text(alphabet=st.sampled_from(["a", "é", "\x00", " ", "z", "\U0001f600"]), max_size=4)
values = st.one_of(st.lists(words, min_size=1, max_size=12),
                   st.lists(st.one_of(words, st.integers(-5, 5)), min_size=1, max_size=12),
                   st.lists(st.integers(0, 9), min_size=1, max_size=5))


@st.composite
def groups(draw):
    out = []
    for op in draw(st.lists(st.integers(0, 2), min_size=1, max_size=4)):
        vs = draw(values)
        n = len(vs)
        if draw(st.booleans()):  # a run per value
            out.append([op, vs, draw(st.sampled_from([None, True])), list(range(n)), None])
        else:  # runs of several values, and the key group of each
            cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
            counts = [b - a for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
            kg = bytes(draw(st.lists(st.integers(0, 127), min_size=n, max_size=n)))
            out.append([op, vs, True, list(range(len(counts))), counts, kg])
    return out


def wire(gs: list) -> list:
    """The groups as the receiver has them: joined, framed, decoded, split, validated."""
    _, body = protocol.decode(protocol.encode("cols", [1, 0, protocol.joined_columns(gs)]))
    protocol.open_columns(body[2])
    protocol.check_columns(body[2], 3)
    return body[2]


@settings(max_examples=400, deadline=None)
@given(groups())
def test_columns_arrive_as_sent(gs):
    sent = copy.deepcopy(gs)
    got = wire(gs)
    assert gs == sent  # the sender's batches are not changed
    assert got == [[g[0], list(g[1]), *g[2:]] for g in sent]
    for a, b in zip(got, sent, strict=True):
        assert [type(v) for v in a[1]] == [type(v) for v in b[1]]


def test_strings_join_unless_one_holds_the_separator():
    plain = [0, ["ab", "", "c"], True, [7], [3]]
    assert protocol.joined_columns([plain])[0][1] == "ab\x00\x00c"
    for column in (["a\x00b", "c"], ["a", 1], [1, "a"], ["only"]):
        assert protocol.joined_columns([[0, column, None, [1] * len(column), None]])[0][1] == column


@pytest.mark.parametrize("joined", ["a\x00b\x00c", "ab"])
def test_a_joined_column_of_the_wrong_length_is_refused(joined):
    body = [[0, joined, True, [5], [2]]]
    protocol.open_columns(body)
    with pytest.raises(protocol.ProtocolError):
        protocol.check_columns(body, 1)
