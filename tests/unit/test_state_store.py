"""The checkpoint store (clasp.runtime.state_store) and the input log: files, checksums, atomic writes."""

from __future__ import annotations

import asyncio
import os

import pytest

from clasp.core import protocol
from clasp.runtime.input_log import InputLog
from clasp.runtime.state_store import (
    CorruptCheckpoint,
    FileStore,
    StateStoreError,
    check_state_dir,
    decode_blob,
    encode_blob,
)


def test_group_files_round_trip_compressed_when_it_pays(tmp_path):
    store = FileStore(tmp_path)
    big = {f"key-{i}": i for i in range(5000)}
    n = store.write_group(1, 3, "count", 7, big)
    raw = len(encode_blob(big, compress=False))
    assert n < raw * 0.9  # repetitive keys compress
    assert store.read_group(1, 3, "count", 7) == big
    small = {"a": 1}
    assert decode_blob(encode_blob(small), "x") == small
    assert not list(tmp_path.rglob(".*.tmp")), "no temporary file left behind"


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "missing"])
def test_a_damaged_file_is_named(tmp_path, damage):
    store = FileStore(tmp_path)
    store.write_group(1, 1, "count", 0, {f"k{i}": i for i in range(100)})
    path = store.group_path(1, 1, "count", 0)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
    with pytest.raises(CorruptCheckpoint) as e:
        store.read_group(1, 1, "count", 0)
    assert str(path) in str(e.value)


def test_state_dir_checks(tmp_path):
    assert check_state_dir(tmp_path / "a" / "b").is_dir()
    (tmp_path / "f").write_text("x")
    with pytest.raises(StateStoreError, match="cannot be used"):
        check_state_dir(tmp_path / "f" / "sub")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(StateStoreError):
            check_state_dir(ro)


def test_input_log_writes_every_chunk_spills_memory_and_drops_below(tmp_path):
    store = FileStore(tmp_path)
    log = InputLog(store, 4, memory_records=25)
    for c in range(5):
        log.append(c, float(c), [f"r{c}-{i}" for i in range(10)])
    assert log.in_memory <= 25 and log.spilled >= 2
    assert sorted(log.sizes_from(2)) == [2, 3, 4]
    assert log.records(0) == [f"r0-{i}" for i in range(10)]  # read back from its file
    assert log.drop_below(3) == 30
    assert sorted(p.stem for p in (tmp_path / "job-4" / "input").glob("*.log")) == ["3", "4"]
    assert log.sizes_from(0) == {3: (3.0, 10), 4: (4.0, 10)}


def test_input_log_counts_the_chunks_it_could_not_write_and_keeps_them(tmp_path):
    (tmp_path / "job-5").write_text("a file where the job's directory should be")
    log = InputLog(FileStore(tmp_path), 5)
    for c in range(3):
        log.append(c, float(c), [f"r{c}-{i}" for i in range(4)])
    assert log.write_failures == 3 and log.in_memory == 12
    assert log.records(1) == [f"r1-{i}" for i in range(4)]  # still replayable, from memory


def test_input_log_writes_on_its_thread_and_hands_back_on_the_loop(tmp_path):
    """In a running loop the writes happen on the log's thread: `written` turns true once the loop took
    the results (`notify` then runs), a whole push is stored as its frame, and a torn file is refused."""
    store = FileStore(tmp_path)
    notified = []

    async def main():
        log = InputLog(store, 7, memory_records=10**6, memory_bytes=3000, notify=lambda: notified.append(1))
        recs = [[f"p{c}-{i}" for i in range(50)] for c in range(4)]
        for c, r in enumerate(recs):
            frame = protocol.encode("push", {"job": 7, "records": r, "req": c})
            log.append(c, float(c), r, 1000, frame if c % 2 == 0 else None)  # odd ones: encoded anew
        assert not log.written(3)  # nothing is written on the loop itself
        for _ in range(500):
            if log.written(3):
                break
            await asyncio.sleep(0.01)
        assert log.written(3) and notified
        assert log.spilled >= 1 and log.in_memory_bytes <= 3000  # a byte bound on memory too
        for c, r in enumerate(recs):
            assert decode_blob((tmp_path / "job-7" / "input" / f"{c}.log").read_bytes(), "x") == r
            assert log.records(c) == r
        log.drop_below(2)
        log.close()

    asyncio.run(main())
    assert sorted(p.name for p in (tmp_path / "job-7" / "input").glob("*.log")) == ["2.log", "3.log"]
    f = tmp_path / "job-7" / "input" / "2.log"
    f.write_bytes(f.read_bytes()[:-5])  # torn: the planner died while writing it
    with pytest.raises(CorruptCheckpoint):
        decode_blob(f.read_bytes(), str(f))
