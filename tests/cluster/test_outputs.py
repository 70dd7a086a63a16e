"""What an operator's return value means (`clasp.core.outputs`), and that the runtime and run_local agree on it."""

from __future__ import annotations

import collections
import enum
import types
from collections import Counter, OrderedDict, defaultdict

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clasp
from clasp.core.outputs import as_outputs
from clasp.testing import outputs_of, run_local


class Color(enum.StrEnum):
    RED = "red"
    AB = "ab"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 7


class Tag(str):
    pass


class Blob(bytes):
    pass


Point = collections.namedtuple("Point", "x y")


class Opaque:
    """Neither iterable nor a built-in scalar."""


def gen(items):
    yield from items


# ----------------------------------------------------------------- the rule, type by type

def test_none_is_no_output():
    assert list(as_outputs(None)) == []


@pytest.mark.parametrize("value", [0, 3, -2**40, 2.5, float("inf"), True, False, Level.HIGH, 1 + 2j])
def test_scalars_and_their_subclasses_are_one_output(value):
    assert list(as_outputs(value)) == [value]


def test_a_non_iterable_object_is_one_output():
    o = Opaque()
    assert list(as_outputs(o)) == [o]


@pytest.mark.parametrize("value", ["", "ab", Tag("ab"), Color.AB, b"ab", Blob(b"ab"), bytearray(b"ab")])
def test_strings_and_bytes_and_their_subclasses_are_one_output(value):
    out = list(as_outputs(value))
    assert out == [value] and out[0] is value


def test_str_enum_is_one_output_not_its_letters():
    out = list(as_outputs(Color.AB))
    assert out == ["ab"] and len(out) == 1


def test_memoryview_is_one_bytes_output():
    buf = bytearray(b"xyz")
    out = list(as_outputs(memoryview(buf)[1:]))
    assert out == [b"yz"] and type(out[0]) is bytes
    buf[1:] = b"QQ"  # a later write to the buffer does not reach the output
    assert out == [b"yz"]


def test_dict_and_every_mapping_are_one_output():
    dd = defaultdict(int, {"a": 1})
    c = Counter("aab")
    od = OrderedDict([("b", 2), ("a", 1)])
    proxy = types.MappingProxyType({"k": 1})
    for m in ({"a": 1}, {}, dd, c, od, proxy):
        out = list(as_outputs(m))
        assert len(out) == 1 and out[0] is m
    assert as_outputs(c)[0] == {"a": 2, "b": 1}


@pytest.mark.parametrize("value, expected", [
    ([1, "a"], [1, "a"]),
    ([], []),
    ((1, 2), [1, 2]),
    (Point(3, 4), [3, 4]),
    (range(3), [0, 1, 2]),
    ({"a": 1, "b": 2}.keys(), ["a", "b"]),
    ({"a": 1}.values(), [1]),
    (iter([5, 6]), [5, 6]),
    (map(str, [1, 2]), ["1", "2"]),
])
def test_other_iterables_are_their_items(value, expected):
    assert list(as_outputs(value)) == expected


def test_generator_and_sets_are_their_items():
    assert list(as_outputs(gen("xy"))) == ["x", "y"]
    assert list(as_outputs(x * 2 for x in range(3))) == [0, 2, 4]
    assert sorted(as_outputs({3, 1, 2})) == [1, 2, 3]
    assert sorted(as_outputs(frozenset({"b", "a"}))) == ["a", "b"]


def test_nested_values_are_interpreted_one_level_only():
    # The items of a returned list are outputs as they are: an inner list, str or dict is one output.
    value = [[1, 2], "ab", {"k": [3]}, (4, 5), Counter("a"), None]
    assert list(as_outputs(value)) == value
    assert list(as_outputs([[]])) == [[]]
    assert list(as_outputs(gen([[1], [2, 3]]))) == [[1], [2, 3]]


def test_a_list_or_tuple_is_returned_as_it_is():
    lst, tup = [1, 2], (1, 2)
    assert as_outputs(lst) is lst and as_outputs(tup) is tup


def test_an_error_inside_a_generator_propagates():
    # A TypeError raised while iterating is the operator's failure, not a sign of a scalar.
    def bad():
        yield 1
        raise TypeError("boom")

    with pytest.raises(TypeError, match="boom"):
        as_outputs(bad())
    with pytest.raises(ZeroDivisionError):
        as_outputs(1 // x for x in [1, 0])


def test_outputs_of_is_the_same_rule_as_a_list():
    for v in (None, "ab", Color.AB, Counter("ab"), memoryview(b"q"), [1, 2], (1,), 3, {2}, Level.LOW):
        assert outputs_of(v) == list(as_outputs(v)) and type(outputs_of(v)) is list
    assert outputs_of(gen([1, 2])) == [1, 2]


# ----------------------------------------------------------------- both execution paths agree
#
# A record is a msgpack-serializable spec [kind, payload]; operators build the Python value from it, so
# the value can be a Counter or a generator although only msgpack travels. `expected_outputs` says what the
# README's rule gives for each kind, written out per kind rather than by calling clasp.core.outputs.

def build(spec):
    kind, p = spec
    if kind == "none":
        return None
    if kind in ("int", "float", "bool", "str", "bytes", "dict", "list"):
        return p
    if kind == "intenum":
        return Level.HIGH if p else Level.LOW
    if kind == "strenum":
        return Color.AB if p else Color.RED
    if kind == "strsub":
        return Tag(p)
    if kind == "bytessub":
        return Blob(p)
    if kind == "bytearray":
        return bytearray(p)
    if kind == "memoryview":
        return memoryview(p)
    if kind == "defaultdict":
        d = defaultdict(list)
        for k, v in p.items():
            d[k].append(v)
        return d
    if kind == "counter":
        return Counter(p)
    if kind == "ordereddict":
        return OrderedDict(p)
    if kind == "tuple":
        return tuple(p)
    if kind == "namedtuple":
        return Point(*p)
    if kind == "gen":
        return gen(p)
    if kind == "set":
        return set(p)
    if kind == "frozenset":
        return frozenset(p)
    if kind == "range":
        return range(p)
    if kind == "keys":
        return p.keys()
    raise AssertionError(kind)


def expected_outputs(spec) -> list:
    kind, p = spec
    if kind == "none":
        return []
    if kind in ("int", "float", "bool", "str", "bytes", "dict", "strsub", "bytessub", "bytearray", "memoryview"):
        return [p]
    if kind == "intenum":
        return [7 if p else 1]
    if kind == "strenum":
        return ["ab" if p else "red"]
    if kind == "defaultdict":
        return [{k: [v] for k, v in p.items()}]
    if kind == "counter":
        counts: dict = {}
        for x in p:
            counts[x] = counts.get(x, 0) + 1
        return [counts]
    if kind == "ordereddict":
        return [dict(p)]
    if kind in ("list", "tuple", "namedtuple", "gen", "set", "frozenset", "keys"):
        return list(p)
    if kind == "range":
        return list(range(p))
    raise AssertionError(kind)


def make(spec):
    return build(spec)


def make_keyed(state, spec):
    return None, build(spec)


async def make_async(spec):
    return build(spec)


def rewrap(v):
    return [v]  # one output equal to the request's value, whatever its type


def agreement_dag(name: str) -> clasp.Dag:
    dag = clasp.Dag(name)
    a = dag.operator("stateless", make, collect=True)
    dag.operator("stateful", make_keyed, stateful=True, key=lambda spec: spec[0], collect=True)
    dag.operator("async", make_async, collect=True)
    a >> dag.operator("next", rewrap, collect=True)
    return dag


SOURCES = ("stateless", "stateful", "async")

ints = st.integers(-2**53, 2**53)
floats = st.floats(allow_nan=False, width=64)
texts = st.text(max_size=6)
leaves = st.one_of(st.none(), st.booleans(), ints, floats, texts, st.binary(max_size=6))
values = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(texts, inner, max_size=3)), max_leaves=6)
hashables = st.one_of(ints, texts)

specs = st.one_of(
    st.tuples(st.just("none"), st.none()),
    st.tuples(st.just("int"), ints),
    st.tuples(st.just("float"), floats),
    st.tuples(st.just("bool"), st.booleans()),
    st.tuples(st.just("str"), texts),
    st.tuples(st.just("bytes"), st.binary(max_size=6)),
    st.tuples(st.just("dict"), st.dictionaries(texts, values, max_size=3)),
    st.tuples(st.just("list"), st.lists(values, max_size=4)),
    st.tuples(st.just("intenum"), st.booleans()),
    st.tuples(st.just("strenum"), st.booleans()),
    st.tuples(st.just("strsub"), texts),
    st.tuples(st.just("bytessub"), st.binary(max_size=6)),
    st.tuples(st.just("bytearray"), st.binary(max_size=6)),
    st.tuples(st.just("memoryview"), st.binary(max_size=6)),
    st.tuples(st.just("defaultdict"), st.dictionaries(texts, values, max_size=3)),
    st.tuples(st.just("counter"), st.lists(texts, max_size=5)),
    st.tuples(st.just("ordereddict"), st.dictionaries(texts, values, max_size=3)),
    st.tuples(st.just("tuple"), st.lists(values, max_size=4)),
    st.tuples(st.just("namedtuple"), st.lists(values, min_size=2, max_size=2)),
    st.tuples(st.just("gen"), st.lists(values, max_size=4)),
    st.tuples(st.just("set"), st.lists(hashables, unique=True, max_size=4)),
    st.tuples(st.just("frozenset"), st.lists(hashables, unique=True, max_size=4)),
    st.tuples(st.just("range"), st.integers(0, 4)),
    st.tuples(st.just("keys"), st.dictionaries(texts, leaves, max_size=3)),
).map(list)


def wire(v):
    """A value as it arrives after msgpack, which is how job.collected returns it."""
    return msgpack.unpackb(msgpack.packb(v, use_bin_type=True), raw=False, strict_map_key=False)


def canon(v):
    """A hashable form of a msgpack value in which equal values are equal (floats by repr: -0.0 != 0.0)."""
    if isinstance(v, dict):
        return ("map", frozenset(Counter((canon(k), canon(x)) for k, x in v.items()).items()))
    if isinstance(v, list):
        return ("list", tuple(canon(x) for x in v))
    if isinstance(v, float):
        return ("float", repr(v))
    return (type(v).__name__, v)


def multiset(outputs) -> Counter:
    return Counter(canon(wire(o)) for o in outputs)


def check_agreement(client, records: list, state: str = "local") -> None:
    expected = multiset(o for spec in records for o in expected_outputs(spec))
    # Sets of strings iterate in a per-process hash order: only the multiset of outputs is defined.
    local = run_local(agreement_dag("agree-local"), records)
    job = client.submit(agreement_dag("agree"), autoscale=False, state=state)
    try:
        assert job.push(records) == len(records)
        job.wait_idle(timeout=60)
        stats = job.stats(fresh=True)
        assert stats["failed"] == 0, stats["errors"]
        for name in SOURCES + ("next",):
            assert multiset(local.collected(name)) == expected, name
            assert multiset(job.collected(name)) == expected, name
    finally:
        job.cancel()


# One cluster round trip per example; each example is a batch of up to 60 return values.
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(records=st.lists(specs, min_size=20, max_size=60))
def test_runtime_and_run_local_agree_on_random_return_values(cluster1, records):
    with clasp.connect(cluster1.planner) as client:
        check_agreement(client, records)


def every_kind() -> list:
    return [["none", None], ["int", 5], ["float", -0.0], ["bool", True], ["str", "ab"], ["bytes", b"ab"],
            ["dict", {"a": [1]}], ["list", [1, [2, 3], "xy"]], ["intenum", True], ["strenum", True],
            ["strsub", "ab"], ["bytessub", b"ab"], ["bytearray", b"ab"], ["memoryview", b"ab"],
            ["defaultdict", {"a": 1}], ["counter", ["a", "b", "a"]], ["ordereddict", {"z": 1, "a": 2}],
            ["tuple", ["t", 1]], ["namedtuple", [1, "y"]], ["gen", ["g", "h"]], ["set", ["s", "t", 3]],
            ["frozenset", [9]], ["range", 3], ["keys", {"k1": 1, "k2": 2}]]


@pytest.mark.parametrize("state", ["local", "remote"])
def test_every_kind_agrees_on_every_execution_path(client1, state):
    # Stateless, keyed (local or remote state), async and a chained successor, with every kind at once.
    check_agreement(client1, every_kind() * 3, state=state)


# ----------------------------------------------------------------- the README's meaning on a real cluster

def test_counter_and_str_enum_through_the_cluster_are_one_output(client1):
    def tally(line):
        return Counter(line.split())

    def color(v):
        return Color.AB if v % 2 else Color.RED

    dag = clasp.Dag("readme-one")
    dag.operator("tally", tally, collect=True)
    lines = ["a b a", "c", ""]
    job = client1.submit(dag, autoscale=False)
    job.push(lines)
    job.wait_idle(timeout=30)
    got = job.collected("tally")
    job.cancel()
    assert sorted(got, key=repr) == sorted([{"a": 2, "b": 1}, {"c": 1}, {}], key=repr)

    dag = clasp.Dag("readme-enum")
    dag.operator("color", color, collect=True)
    job = client1.submit(dag, autoscale=False)
    job.push(range(10))
    job.wait_idle(timeout=30)
    got = job.collected("color")
    job.cancel()
    assert sorted(got) == sorted(["ab" if v % 2 else "red" for v in range(10)])


def test_a_stateful_operator_whose_generator_raises_fails_that_request_only(client1):
    # The error surfaces while its outputs are read; the worker records it and goes on.
    def emit(state, v):
        def outs():
            yield v
            if v % 5 == 0:
                raise ValueError(f"bad {v}")
        return (state or 0) + 1, outs()

    dag = clasp.Dag("gen-raises")
    e = dag.operator("emit", emit, stateful=True, key=lambda v: v % 3)
    e >> dag.operator("sink", lambda v: v, collect=True)
    job = client1.submit(dag, autoscale=False)
    job.push(range(50))
    job.wait_idle(timeout=30)
    stats = job.stats(fresh=True)
    assert stats["failed"] == 10 and stats["operators"]["emit"]["errors"] == 10
    assert sorted(job.collected("sink")) == [v for v in range(50) if v % 5]
    # The worker still runs the next job.
    job.cancel()
    dag = clasp.Dag("after")
    dag.operator("id", lambda v: v, collect=True)
    job = client1.submit(dag, autoscale=False)
    job.push(range(5))
    job.wait_idle(timeout=30)
    assert sorted(job.collected("id")) == [0, 1, 2, 3, 4]
    job.cancel()
