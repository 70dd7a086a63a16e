"""FileSource (clasp.connectors.files) and IterableSource, read as the workers read them, and in run_local."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import clasp
from clasp.connectors import file_source
from clasp.connectors.files import FileSource
from clasp.testing import IterableSource, run_local


def read_all(source, positions=None, limit=7):
    """Every partition to its end, a batch of `limit` at a time: values per partition, final positions."""
    async def go():
        out, pos = {}, {}
        for p in source.partitions():
            r = source.open(p, (positions or {}).get(p))
            vals = []
            while True:
                b = await r.next_batch(limit)
                vals.extend(b)
                if not b:
                    assert r.exhausted
                    break
            out[p], pos[p] = vals, r.position()
            await r.close()
        return out, pos
    return asyncio.run(go())


def write_lines(path, lines, end="\n"):
    path.write_text("".join(line + end for line in lines))
    return path


@settings(max_examples=80, deadline=None)
@given(st.lists(st.text(alphabet="ab é\t", max_size=30), max_size=60), st.integers(1, 200),
       st.sampled_from(["\n", "\r\n"]), st.booleans(), st.sampled_from([1, 7, 64, 1 << 18]), st.booleans())
def test_byte_ranges_read_every_line_once_in_order(tmp_path_factory, lines, range_bytes, end, last_newline,
                                                   read_bytes, nowait):
    """Whatever the ranges, the blocks read ahead (down to a byte: lines longer than a block) and the way they
    are read (on the loop from the page cache, or on a thread), and with or without a newline at the end."""
    path = write_lines(tmp_path_factory.mktemp("r") / "f.txt", lines, end)
    if not last_newline and lines:
        path.write_bytes(path.read_bytes()[:-len(end)])
        if lines[-1] == "":
            lines = lines[:-1]  # an empty last line without its newline is no line
    src = FileSource(str(path), range_bytes=range_bytes)
    parts = src.partitions()
    size = path.stat().st_size
    assert len(parts) == max(1, -(-size // range_bytes)) or size == 0
    was = file_source.READ_BYTES, file_source.NOWAIT
    file_source.READ_BYTES, file_source.NOWAIT = read_bytes, was[1] if nowait else None
    try:
        got, pos = read_all(src)
    finally:
        file_source.READ_BYTES, file_source.NOWAIT = was
    assert [v for p in parts for v in got[p]] == lines
    assert pos[parts[-1]] == size


def test_a_range_resumes_at_its_position_without_loss_or_repeat(tmp_path):
    lines = [f"line {i} " + "x" * (i % 13) for i in range(500)]
    path = write_lines(tmp_path / "big.txt", lines)
    src = FileSource(str(path), range_bytes=1000)
    parts = src.partitions()
    assert len(parts) > 3 and all("@" in p for p in parts)
    first, stopped = {}, {}

    async def half():
        for p in parts:
            r = src.open(p, None)
            first[p] = await r.next_batch(5)
            stopped[p] = r.position()
    asyncio.run(half())
    rest, _ = read_all(src, stopped)
    assert [v for p in parts for v in first[p] + rest[p]] == lines


def test_glob_jsonl_and_a_bad_line_named_with_file_and_offset(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"w": 1}\n\n{"w": 2}\n')
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"w": 3}\n{not json}\n{"w": 4}\n')
    src = FileSource(str(tmp_path / "*.jsonl"), format="jsonl")
    assert [p.rsplit("/", 1)[1] for p in src.partitions()] == ["a.jsonl", "b.jsonl"]
    async def go():
        r = src.open(str(bad), None)
        vals = await r.next_batch(10)
        return vals, r.take_errors(), r.position()
    vals, errors, pos = asyncio.run(go())
    assert vals == [{"w": 3}, {"w": 4}] and pos == bad.stat().st_size
    assert len(errors) == 1 and str(bad) in errors[0] and "at byte 9" in errors[0]


LINES = ['{"w": 1}', ' {"w": 2} ', '[1, 2]', "1,2", "1 2", "{", "", "  ", '"x"', "3.5\r", "nul", '{"a": "\u00e9"}',
         "[1,[2", "3]]", "\t7", "8\t", "-", "true", '"a\tb"',
         # read by json, not orjson: an integer beyond 64 bits (orjson's a float), NaN, 1e400, a lone surrogate
         "123456789012345678901234567890", '{"n": -9223372036854775809}', "NaN", "1e400", '"\\ud800"',
         '{"n": 18446744073709551615, "x": 0.1}', '{"id": 7, "t": 1.5e3, "s": "x"}']


# Objects, and lines that would make objects of a JSON array's elements together, or two elements of one line
# (a block of objects is decoded as one array).
OBJECT_LINES = ['{"a": 1}', ' {"b": {"c": [1]}}\r', '{"d": [', '{"e": 2}]}', '{"f": 1}, {"g": 2}', '{"h": 1} ,{"i": 2}',
                '{"j": "},"}', '{"k": 1}]', '[{"l": 1}', "", '{"m": 12345678901234567890}', '{"n": NaN}']


@settings(max_examples=120, deadline=None)
@given(st.one_of(st.lists(st.sampled_from(LINES), max_size=30), st.lists(st.sampled_from(OBJECT_LINES), max_size=30)))
@example(['{"d": [', '{"e": 2}]}'])  # json's scanner once read these two lines as one object
@example(["[1,[2", "3]]", '{"a": 1}'])
def test_jsonl_lines_read_as_json_loads_reads_each_and_the_others_are_named(tmp_path_factory, lines):
    """Each line is what json.loads makes of it alone (blanks around a value included); a blank one is skipped;
    any other is an error, even where lines together would make JSON (`[1,[2` then `3]]`, `{"d": [` then
    `{"e": 2}]}`)."""
    path = write_lines(tmp_path_factory.mktemp("j") / "x.jsonl", lines)
    want, bad = [], 0
    for line in lines:
        text = line.rstrip("\r")
        if not text.strip():
            continue
        try:
            want.append(json.loads(text))
        except ValueError:
            bad += 1
    src = FileSource(str(path), format="jsonl")

    async def go():
        r = src.open(str(path), None)
        vals = []
        while not r.exhausted:
            vals.extend(await r.next_batch(5))
        return vals, r.take_errors()
    vals, errors = asyncio.run(go())
    assert vals == want and len(errors) == bad


def test_clean_utf8_blocks_go_to_orjson_and_the_others_to_json(tmp_path, monkeypatch):
    """A block whose every line orjson reads as json does is decoded by it; a block with a line
    it reads otherwise (a run of 19 digits) or not at all (NaN) by json, with the same values as json.loads."""
    pytest.importorskip("orjson")
    calls = []

    def counted(line):
        calls.append(line)
        return fast(line)
    fast = file_source._fast_loads
    monkeypatch.setattr(file_source, "_fast_loads", counted)
    cases = {"clean": ['{"a": 1, "b": [1.5, "x"]}', "2", '"\u00e9"'], "objects": ['{"a": 1}', '{"b": {"c": "\u00e9"}}'],
             "long": ['{"a": 1}', "12345678901234567890123"], "nan": ['{"a": 1}', "NaN"]}
    for name, lines in cases.items():
        calls.clear()
        path = write_lines(tmp_path / f"{name}.jsonl", lines)
        (vals,) = read_all(FileSource(str(path), format="jsonl"), limit=100)[0].values()
        assert vals == [json.loads(line) for line in lines]
        # a block of objects in one call, as a JSON array; any other block tried so, then a line a call
        assert len(calls) == {"clean": 4, "objects": 1, "long": 0, "nan": 3}[name], name


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 22), st.sampled_from(["a", ",", " ", '"x":', ".", "e", "-"])), max_size=12),
       st.integers(0, 400))
def test_a_run_of_19_digits_is_found_wherever_it_starts_and_no_shorter_one_counts(parts, used):
    """Every third byte is looked at first: a run of 19 digits or more is found at any offset (it holds 6 of
    them in a row), a block with shorter runs only is passed, and the bytes past `used` are not looked at."""
    import re

    block = "".join("7" * k + sep for k, sep in parts).encode()
    used = min(used, len(block))
    assert file_source._long_digits(block, used) == (re.search(rb"[0-9]{19}", block[:used]) is not None)


def test_csv_rows_are_dicts_by_the_header_in_every_range(tmp_path):
    path = tmp_path / "t.csv"
    rows = [{"name": f"n{i}", "n": str(i)} for i in range(300)]
    path.write_text("name,n\n" + "".join(f"{r['name']},{r['n']}\n" for r in rows))
    got, _ = read_all(FileSource(str(path), format="csv", range_bytes=256))
    assert [v for vs in got.values() for v in vs] == rows
    with pytest.raises(ValueError):
        FileSource(str(path), format="xml")
    with pytest.raises(FileNotFoundError):
        FileSource(str(tmp_path / "none*.txt")).partitions()


def split(line):
    return line.split()


def count(state, word):
    n = (state or 0) + 1
    return n, [[word, n]]


def word_count(source) -> clasp.Dag:
    dag = clasp.Dag("wc")
    src = dag.source("lines", source)
    s = dag.operator("split", split)
    c = dag.operator("count", count, stateful=True, key=clasp.identity, collect=True)
    src >> s >> c
    return dag


def test_run_local_reads_declared_sources(tmp_path):
    lines = ["a b", "b c c", "", "a"]
    write_lines(tmp_path / "in.txt", lines)
    job = run_local(word_count(FileSource(str(tmp_path / "in.txt"))))
    assert job.state("count") == {"a": 2, "b": 2, "c": 2}
    job2 = run_local(word_count(IterableSource(lines, partitions=3)))
    assert job2.state("count") == job.state("count")
    assert Counter(w for w, _ in job2.collected("count")) == Counter({"a": 2, "b": 2, "c": 2})
    with pytest.raises(clasp.DagError, match="nothing to push"):
        run_local(word_count(IterableSource(lines)), ["x"])


def test_iterable_source_partitions_and_positions():
    src = IterableSource(range(10), partitions=3)
    got, pos = read_all(src, limit=2)
    assert got == {"part-0": [0, 3, 6, 9], "part-1": [1, 4, 7], "part-2": [2, 5, 8]}
    assert pos == {"part-0": 4, "part-1": 3, "part-2": 3}
    again, _ = read_all(src, {"part-0": 2})
    assert again["part-0"] == [6, 9]
    assert json.dumps(pos)  # positions are plain data


def test_jsonl_reads_the_same_without_orjson(tmp_path, monkeypatch):
    """orjson is a dependency, but a FileSource without it decodes every block with json's scanner alone."""
    lines = ['{"a": 1, "b": [1.5, "x"]}', "2", '"\\u00e9"', "123456789012345678901234567890"]
    path = write_lines(tmp_path / "x.jsonl", lines)
    monkeypatch.setattr(file_source, "_fast_loads", None)
    (vals,) = read_all(FileSource(str(path), format="jsonl"), limit=100)[0].values()
    assert vals == [json.loads(line) for line in lines]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(LINES), max_size=30), st.sampled_from([[b"1"], [b'"'], [b"[", b"a"], [b"NaN", b"9"]]),
       st.sampled_from(["utf-8", "latin-1"]), st.integers(1, 8))
def test_select_decodes_the_lines_holding_one_of_its_byte_strings_only(tmp_path_factory, lines, select, encoding,
                                                                       limit):
    """Lines holding none of `select`'s byte strings are skipped undecoded, invalid or not; the others are read
    as without it, the invalid ones among them named at their byte offsets."""
    path = tmp_path_factory.mktemp("s") / "x.jsonl"
    path.write_bytes("".join(line + "\n" for line in lines).encode(encoding, errors="replace"))
    want, bad, at = [], [], 0
    for raw in path.read_bytes().split(b"\n")[:-1]:
        start, at = at, at + len(raw) + 1
        text = raw.decode(encoding).rstrip("\r")
        if not any(x in raw for x in select) or not text.strip():
            continue
        try:
            want.append(json.loads(text))
        except ValueError:
            bad.append(f"at byte {start}:")
    src = FileSource(str(path), format="jsonl", encoding=encoding, select=select)

    async def go():
        r = src.open(str(path), None)
        vals = []
        while not r.exhausted:
            vals.extend(await r.next_batch(limit))
        return vals, r.take_errors()
    vals, errors = asyncio.run(go())
    assert vals == want
    assert [e.split(" at byte ")[1].split(":")[0] for e in errors] == [b.split()[2][:-1] for b in bad]


def test_select_is_byte_strings_for_json_lines():
    for kwargs in ({"select": "x"}, {"select": []}, {"select": [b""]}, {"select": b"x", "format": "lines"}):
        with pytest.raises(ValueError, match="select"):
            FileSource("x", **{"format": "jsonl", **kwargs})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60), st.integers(1, 70), st.integers(0, 30))
def test_whole_lines_are_the_first_n_lines_of_a_block_however_long(lengths, n, tail):
    """`_whole_lines` finds the first `n` whole lines (or all there are) whatever the lines' lengths around
    their mean, and never the unfinished line at the end of the block."""
    lines = [b"x" * k + b"\n" for k in lengths]
    block = b"".join(lines) + b"y" * tail
    taken = lines[:n]
    assert file_source._whole_lines(block, n) == (sum(map(len, taken)), len(taken))
