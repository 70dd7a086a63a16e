"""The checkpoint store (clasp.runtime.state_store) and the input log: files, checksums, atomic writes."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import signal

import pytest

from clasp.core import protocol
from clasp.runtime.input_log import InputLog, stored_chunks
from clasp.runtime.state_store import (
    CorruptCheckpoint,
    FileStore,
    StateStoreError,
    check_state_dir,
    encode_blob,
    read_snapshot,
    snapshot_name,
)


def _write(store, job, ckpt, worker, groups: dict, compress=True) -> int:
    return store.write_snapshot(job, ckpt, worker, ((op, g, encode_blob(state, compress))
                                                    for (op, g), state in groups.items()))


def test_a_snapshot_is_one_file_read_back_group_by_group_compressed_when_it_pays(tmp_path):
    store = FileStore(tmp_path)
    big = {f"key-{i}": i for i in range(5000)}
    groups = {("count", 7): big, ("count", 3): {"a": 1}, ("sum", 7): {"b": [1, 2]}}
    n = _write(store, 1, 3, "w0", groups)
    assert n < len(encode_blob(big, compress=False)) * 0.9  # repetitive keys compress
    assert n == store.snapshot_path(1, 3, "w0").stat().st_size
    assert sorted(p.name for p in store.ckpt_dir(1, 3).iterdir()) == ["w0.snapshot"], "one file, no temporary"
    assert sorted(read_snapshot(store.snapshot_path(1, 3, "w0"))) == sorted((*k, v) for k, v in groups.items())
    store.commit(1, 3, {"workers": ["w0"]})
    assert store.read_groups(1, 3, {"count": [3], "sum": [7]}) == [("count", 3, {"a": 1}), ("sum", 7, {"b": [1, 2]})]
    assert store.read_groups(1, 3, {}) == []
    assert _write(store, 1, 4, "w0", {}) == 0 and not any(store.ckpt_dir(1, 4).iterdir()), "no group, no file"


def test_any_worker_reads_groups_from_the_files_the_manifest_counts(tmp_path):
    """Groups written by two workers are read by a third; a file of a worker the manifest does not name (a
    stray) is not read, and a group no counted file holds is an error naming the checkpoint."""
    store = FileStore(tmp_path)
    _write(store, 2, 5, "w0", {("count", g): {f"k{g}": g} for g in range(0, 64, 2)})
    _write(store, 2, 5, "w1", {("count", g): {f"k{g}": g} for g in range(1, 64, 2)})
    _write(store, 2, 5, "w9", {("count", 64): {"stray": 1}})
    store.commit(2, 5, {"workers": ["w0", "w1", "w2"]})  # w2 owned no group: it wrote no file
    got = store.read_groups(2, 5, {"count": [5, 2, 63]})
    assert sorted(got) == [("count", 2, {"k2": 2}), ("count", 5, {"k5": 5}), ("count", 63, {"k63": 63})]
    with pytest.raises(CorruptCheckpoint, match="key group 64 of 'count'") as e:
        store.read_groups(2, 5, {"count": [64]})
    assert e.value.path == str(store.ckpt_dir(2, 5))


def test_worker_ids_that_are_no_file_names_are_written_in_hex(tmp_path):
    store = FileStore(tmp_path)
    for wid in ["w-1.a", "../evil", ".hidden", "x/y", "é"]:
        path = store.snapshot_path(1, 1, wid)
        assert path.parent == store.ckpt_dir(1, 1) and not path.name.startswith(".")
        assert snapshot_name(wid) == (wid + ".snapshot" if wid == "w-1.a" else "@" + wid.encode().hex() + ".snapshot")


def test_checkpoints_of_the_layout_before_are_still_read(tmp_path):
    store = FileStore(tmp_path)
    d = store.ckpt_dir(1, 2)
    d.mkdir(parents=True)
    (d / "count.4.kg").write_bytes(encode_blob({"old": 4}))
    store.commit(1, 2, {"workers": ["w0"]})
    assert store.read_groups(1, 2, {"count": [4]}) == [("count", 4, {"old": 4})]


@pytest.mark.parametrize("damage", ["truncate", "truncate blob", "flip", "flip index", "empty", "missing", "manifest"])
def test_a_damaged_file_is_named(tmp_path, damage):
    store = FileStore(tmp_path)
    _write(store, 1, 1, "w0", {("count", g): {f"k{i}": i for i in range(100)} for g in range(3)})
    store.commit(1, 1, {"workers": ["w0"]})
    path = store.snapshot_path(1, 1, "w0")
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "truncate blob":
        path.write_bytes(data[:-1])
    elif damage == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif damage == "flip index":
        path.write_bytes(data[:20] + bytes([data[20] ^ 0xFF]) + data[21:])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "missing":
        path.unlink()
    else:
        path = store.ckpt_dir(1, 1) / "COMPLETE.json"
        path.write_text("{")
    with pytest.raises(CorruptCheckpoint) as e:
        store.read_groups(1, 1, {"count": [2]})
    assert str(path if damage != "missing" else store.ckpt_dir(1, 1)) in str(e.value)


def test_a_write_that_fails_leaves_the_checkpoint_before_and_no_temporary_file(tmp_path):
    """The disk fills mid-file (a file size limit: the kernel refuses the write past it, as a full disk
    would): no file of the failed checkpoint, the one before intact."""
    store = FileStore(tmp_path)
    _write(store, 1, 1, "w0", {("count", 0): {"a": 1}})
    store.commit(1, 1, {"workers": ["w0"]})
    big = {("count", g): {f"k{g}-{i}": os.urandom(8) for i in range(500)} for g in range(8)}
    was_signal = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16384, limits[1]))
    try:
        with pytest.raises(OSError) as e:
            _write(store, 1, 2, "w0", big)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, was_signal)
    assert e.value.errno == errno.EFBIG
    assert not store.snapshot_path(1, 2, "w0").exists() and not list(tmp_path.rglob(".*.tmp"))
    assert store.read_groups(1, 1, {"count": [0]}) == [("count", 0, {"a": 1})]


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
    assert log.records(0) == [f"r0-{i}" for i in range(10)]  # read back from its segment
    assert log.drop_below(3) == 30
    assert log.sizes_from(0) == {3: (3.0, 10), 4: (4.0, 10)}
    inp = tmp_path / "job-4" / "input"
    assert [p.name for p in inp.iterdir()] == ["0.seg"]  # chunks 3 and 4 are in it still
    log.append(5, 5.0, ["r5"])  # the drop closed the segment: a new one
    assert sorted(p.name for p in inp.iterdir()) == ["0.seg", "5.seg"]
    log.drop_below(5)
    assert [p.name for p in inp.iterdir()] == ["5.seg"]
    assert {c: v[:2] for c, v in stored_chunks(inp).items()} == {5: (1, log.where[5][2])}
    assert log.records(5) == ["r5"]


def test_input_log_segments_read_back_after_a_restart_up_to_a_torn_tail(tmp_path):
    """A restarted planner finds every chunk of the segments (`stored_chunks`) and reads each back from its
    place; a record torn by a crash while it was appended ends the segment, and a file of a chunk of its
    own (the layout before) is still read."""
    store = FileStore(tmp_path)
    log = InputLog(store, 3, memory_records=0, memory_bytes=0)
    recs = {c: [f"q{c}-{i}" for i in range(c + 1)] for c in range(4)}
    for c, r in recs.items():
        frame = protocol.encode("push", {"job": 3, "records": r, "req": c})
        log.append(c, 0.0, r, 100, frame if c % 2 else None)
    log.close()
    inp = tmp_path / "job-3" / "input"
    (inp / "9.log").write_bytes(encode_blob([f"old{i}" for i in range(3)], compress=False))
    found = stored_chunks(inp)
    assert {c: v[0] for c, v in found.items()} == {0: 1, 1: 2, 2: 3, 3: 4, 9: 3}
    again = InputLog(store, 3)
    for c, (size, nbytes, where) in found.items():
        again.load(c, size, 0.0, nbytes, where)
    assert {c: again.records(c) for c in recs} == recs and again.records(9) == ["old0", "old1", "old2"]
    seg = inp / "0.seg"
    kept = seg.read_bytes()
    seg.write_bytes(kept[:-5])  # torn: the planner died while appending chunk 3
    assert sorted(stored_chunks(inp)) == [0, 1, 2, 9]
    data = bytearray(kept)
    data[found[1][2][1] + 20] ^= 0xFF  # a byte of chunk 1 flipped: its checksum fails, the rest is skipped
    seg.write_bytes(bytes(data))
    assert sorted(stored_chunks(inp)) == [0, 9]
    again.drop_below(4)  # what a restarted planner's log no longer needs goes: its segment and the old file
    assert [p.name for p in inp.iterdir()] == ["9.log"] and sorted(again.entries) == [9]
    again.drop_below(10)
    assert list(inp.iterdir()) == []


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
            assert log.records(c) == r
        log.drop_below(2)
        log.append(4, 4.0, ["x"])  # into a new segment: the drop closed the first
        log.flush()
        log.drop_below(4)
        log.close()

    asyncio.run(main())
    inp = tmp_path / "job-7" / "input"
    assert [p.name for p in inp.iterdir()] == ["4.seg"]
    assert {c: v[0] for c, v in stored_chunks(inp).items()} == {4: 1}


def test_input_log_goes_on_after_a_short_write():
    """A short `writev` (a signal, a full disk's last blocks) leaves the rest of the parts to write next."""
    from clasp.runtime.input_log import _rest

    parts = [b"head", b"0123456789"]
    assert _rest(parts, 0) == parts
    assert [bytes(p) for p in _rest(parts, 2)] == [b"ad", b"0123456789"]
    assert [bytes(p) for p in _rest(parts, 4)] == [b"0123456789"]
    assert [bytes(p) for p in _rest(parts, 7)] == [b"3456789"]
    assert _rest(parts, 14) == []
