"""Pushes in segments (`protocol.pack_segments`), which the planner forwards to the workers undecoded: a
malformed segment refuses its push with a clear error and a count in `clasp_bad_messages_total`; a segment the
planner passes but a worker cannot decode (a string that is not UTF-8) fails its records at the worker, counted
there, and the job goes idle with every other record counted exactly; a keyed source's pushes are decoded at the
planner, so there such a segment refuses the push."""

from __future__ import annotations

import collections
import re
import urllib.request

import msgpack
import pytest
import zmq

import clasp
from clasp.core import protocol
from clasp.runtime.security import Security
from tests.conftest import make_lines, start_cluster, wait_for, wordcount_dag

BAD_UTF8 = b"\x91\xa4w1 \xff"  # one str of four bytes that are not UTF-8: well-formed msgpack all the same


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    c = start_cluster(tmp_path_factory, 2)
    yield c
    c.stop()


def bad_counts(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {r: float(v) for r, v in re.findall(r'^clasp_bad_messages_total\{reason="([^"]+)"\} (\S+)$', text, re.M)}


class RawClient:
    """A client's DEALER that sends push frames as given (no `Job.push` framing, no checks)."""

    def __init__(self, cluster):
        self.ctx = zmq.Context()
        self.sock = Security(cluster.keys_dir).client(self.ctx.socket(zmq.DEALER))
        self.sock.connect(cluster.planner)
        self.req = 100

    def push(self, body: dict) -> tuple[str, dict]:
        """Send one push frame; returns the planner's answer (type, body)."""
        self.req += 1
        self.sock.send(msgpack.packb([protocol.VERSION, "push", {"req": self.req, **body}]))
        assert self.sock.poll(10_000), "no answer to the push"
        return protocol.decode(self.sock.recv())

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def keyed_root_dag() -> clasp.Dag:
    dag = clasp.Dag("keyed-root")
    dag.operator("count", lambda s, w: ((s or 0) + 1, None), stateful=True, key=lambda w: w)
    return dag


def refused(answer: tuple[str, dict], reason: str) -> str:
    """The text of the planner's refusal of a push: an error reply to it, or an `error` message."""
    mtype, body = answer
    if mtype == "reply":
        assert not body["ok"], body
        assert reason in body["error"], body
        return body["error"]
    assert mtype == "error" and body["reason"] == reason, body
    return body["detail"]


def test_malformed_segments_refuse_the_push_and_are_counted(cluster2):
    good = msgpack.packb(["a b", "c"])
    cases = [
        {"segments": ["not bytes"]},
        {"segments": [b"\xc1"]},  # not an array
        {"segments": [good[:-1]]},  # truncated
        {"segments": [good + good]},  # two arrays in one segment
        {"segments": [msgpack.packb([])]},  # no records
        {"segments": [good], "records": ["a"]},
        {"segments": [good] * (protocol.MAX_SEGMENTS + 1)},
        {"segments": [msgpack.ExtType(protocol.SEG_LZ4, b"\0\0")]},  # compressed, no room for its head
        {"segments": [msgpack.ExtType(protocol.SEG_LZ4, protocol.SEG_LZ4_HEAD.pack(0, 9) + b"x")]},  # no records
    ]
    with clasp.connect(cluster2.planner) as client:
        job = client.submit(wordcount_dag("segments-malformed"))
        raw = RawClient(cluster2)
        try:
            before = sum(bad_counts(cluster2.metrics["planner"]).values())
            for body in cases:
                text = refused(raw.push({"job": job.id, **body}), "bad_field")
                assert "push." in text
        finally:
            raw.close()
        assert sum(bad_counts(cluster2.metrics["planner"]).values()) - before == len(cases)
        lines = make_lines(2000, seed=3)
        job.push(lines)  # nothing of the refused pushes was admitted
        job.wait_idle(60)
        assert job.state("count") == dict(collections.Counter(w for line in lines for w in line.split()))
        assert cluster2.alive() and not cluster2.events


def test_a_segment_no_worker_can_decode_fails_its_records_there(cluster2):
    lines = make_lines(3000, seed=5)
    with clasp.connect(cluster2.planner) as client:
        job = client.submit(wordcount_dag("segments-utf8"))
        before = [bad_counts(url).get("undecodable", 0.0) for url in cluster2.metrics["workers"]]
        raw = RawClient(cluster2)
        try:
            segments = protocol.pack_segments(lines)
            mtype, body = raw.push({"job": job.id, "segments": [*segments[:3], BAD_UTF8, *segments[3:]]})
        finally:
            raw.close()
        assert mtype == "reply" and body["ok"] and body["result"]["accepted"] == len(lines) + 1, body
        done = job.wait_idle(60)  # the failed record is done too: nothing waits on it
        assert done["pushed"] == len(lines) + 1
        assert job.state("count") == dict(collections.Counter(w for line in lines for w in line.split()))
        errors = wait_for(lambda: job.stats(fresh=True)["errors"], timeout=15, what="the segment's error")
        assert any("not decodable" in e["error"] for e in errors), errors
        after = [bad_counts(url).get("undecodable", 0.0) for url in cluster2.metrics["workers"]]
        assert sum(after) - sum(before) == 1
        assert cluster2.alive() and not cluster2.events


def test_a_compressed_segment_that_does_not_hold_its_count_fails_its_records_at_the_worker(cluster2):
    lines = make_lines(3000, seed=6)
    segments = protocol.pack_segments(lines)
    assert all(type(s) is msgpack.ExtType for s in segments)  # Word Count's lines compress
    garbage = msgpack.ExtType(protocol.SEG_LZ4, protocol.SEG_LZ4_HEAD.pack(4, 100) + b"\xff" * 20)
    with clasp.connect(cluster2.planner) as client:
        job = client.submit(wordcount_dag("segments-lz4"))
        before = [bad_counts(url).get("undecodable", 0.0) for url in cluster2.metrics["workers"]]
        raw = RawClient(cluster2)
        try:
            mtype, body = raw.push({"job": job.id, "segments": [*segments[:2], garbage, *segments[2:]]})
        finally:
            raw.close()
        assert mtype == "reply" and body["ok"] and body["result"]["accepted"] == len(lines) + 4, body
        assert job.wait_idle(60)["pushed"] == len(lines) + 4  # the four failed records are done too
        assert job.state("count") == dict(collections.Counter(w for line in lines for w in line.split()))
        errors = wait_for(lambda: job.stats(fresh=True)["errors"], timeout=15, what="the segment's error")
        assert any("not decodable" in e["error"] for e in errors), errors
        after = [bad_counts(url).get("undecodable", 0.0) for url in cluster2.metrics["workers"]]
        assert sum(after) - sum(before) == 1
        assert cluster2.alive() and not cluster2.events


def test_a_keyed_source_decodes_pushes_at_the_planner(cluster2):
    with clasp.connect(cluster2.planner) as client:
        job = client.submit(keyed_root_dag())
        words = [f"w{i % 17}" for i in range(500)]
        job.push(words)  # the client's segments, decoded at admission for the key function
        raw = RawClient(cluster2)
        try:
            before = bad_counts(cluster2.metrics["planner"]).get("undecodable", 0.0)
            refused(raw.push({"job": job.id, "segments": [msgpack.packb(["w1"]), BAD_UTF8]}), "undecodable")
            assert bad_counts(cluster2.metrics["planner"]).get("undecodable", 0.0) == before + 1
        finally:
            raw.close()
        job.wait_idle(60)
        assert job.state("count") == dict(collections.Counter(words))
