"""Randomized stress test: per-key order and exact counts across back-to-back live rescales.

A keyed *source* keeps an order-sensitive hash of its records' sequence numbers; it passes each record on
to a keyed *inner* operator (same key) that keeps its own order-sensitive hash, and to a splitter feeding a
keyed word counter. Records are pushed in order in chunks, with `client.scale(n)` (random n) after each,
so migrations follow each other before the previous one settles. Every seed must reproduce the sequential
reference exactly: any row run out of order, twice or not at all changes a hash or a count.

CLASP_STRESS_SEEDS=N runs N seeds (default 20); CLASP_STRESS_RECORDS=M records per seed.
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest

import clasp
from tests.conftest import start_cluster

SEEDS = int(os.environ.get("CLASP_STRESS_SEEDS", "20"))
RECORDS = int(os.environ.get("CLASP_STRESS_RECORDS", "12000"))
CHUNKS = 12
MASK = (1 << 61) - 1
WORKERS = 5


def chain(h: int, seq: int) -> int:
    """One step of an order-sensitive hash: any two sequences that differ in order differ in hash."""
    return ((h * 1_000_003) ^ seq) & MASK


def first_char(r: str) -> str:
    return r[0]


def source_order(state, r):
    seq = int(r.split(" ", 2)[1])
    return chain(state or 1, seq), r


def inner_order(state, r):
    seq = int(r.split(" ", 2)[1])
    return chain(state or 7, seq), None


def split(r: str):
    return r.split(" ", 2)[2].split()


def count(state, w):
    return (state or 0) + 1, None


def build_dag(name: str = "order-stress", inner_fn=inner_order, collect: bool = False) -> clasp.Dag:
    """`inner_fn`, `collect`: the recovery tests' inner_order emits each record's sequence number, collected
    so they can check it exactly once."""
    dag = clasp.Dag(name)
    src = dag.operator("source_order", source_order, stateful=True, key=first_char)
    inner = dag.operator("inner_order", inner_fn, stateful=True, key=first_char, collect=collect)
    sp = dag.operator("split", split)
    c = dag.operator("count", count, stateful=True, key=lambda w: w)
    src >> inner
    src >> sp
    sp >> c
    return dag


def generate(n: int, rng: random.Random, vocabulary: int = 300, max_words: int = 4) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [f"w{i}" for i in range(vocabulary)]
    return [f"{rng.choice(letters)} {i} " + " ".join(rng.choices(words, k=rng.randint(1, max_words)))
            for i in range(n)]


def reference(records: list[str]) -> tuple[dict, dict, dict]:
    src: dict[str, int] = {}
    inner: dict[str, int] = {}
    counts: Counter = Counter()
    for r in records:
        k, seq, rest = r.split(" ", 2)
        src[k] = chain(src.get(k, 1), int(seq))
        inner[k] = chain(inner.get(k, 7), int(seq))
        counts.update(rest.split())
    return src, inner, dict(counts)


@pytest.fixture(scope="module")
def cluster5(tmp_path_factory):
    c = start_cluster(tmp_path_factory, WORKERS, planner_args=["--no-autoscale"])
    yield c
    c.stop()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_per_key_order_holds_across_back_to_back_rescales(cluster5, seed):
    rng = random.Random(seed)
    records = generate(RECORDS, rng)
    size = -(-len(records) // CHUNKS)
    with clasp.connect(cluster5.planner) as client:
        job = client.submit(build_dag(), autoscale=False)
        try:
            scales = []
            for i in range(0, len(records), size):
                job.push(records[i:i + size])
                n = rng.randint(1, WORKERS)
                scales.append(n)
                record = client.scale(n)
                assert not record["failed"], record
            job.wait_idle(timeout=120)
            src, inner, counts = reference(records)
            stats = job.stats(fresh=True)
            assert stats["completed"] == len(records) and stats["lost"] == 0 and stats["failed"] == 0
            assert stats["operators"]["count"]["processed"] == sum(counts.values())
            assert job.state("count") == counts
            bad_src = sorted(k for k, v in job.state("source_order").items() if src.get(k) != v)
            bad_inner = sorted(k for k, v in job.state("inner_order").items() if inner.get(k) != v)
            assert job.state("source_order").keys() == src.keys()
            assert not bad_src and not bad_inner, (f"seed {seed}, scales {scales}: keys out of order "
                                                   f"at the source {bad_src}, inner {bad_inner}")
        finally:
            job.cancel()
