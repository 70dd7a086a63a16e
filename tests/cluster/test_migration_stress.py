"""Randomized stress test: migrations of 400,000 keys of order-sensitive state while records flow.

Each key keeps an order-sensitive hash of its records' sequence numbers (`test_order_stress.chain`). One
thread pushes the records in order, in chunks, while the test re-places the job onto a random number of
workers again and again, so key groups move (as one blob each, decoded where first used, moved on still
serialized when they move again before that) with records of the same groups in flight and held. Every
seed must end with the sequential reference's hash for every key: a record run out of order, twice or not
at all changes its key's hash.

CLASP_MIGRATION_STRESS_SEEDS=N runs N seeds (default 3); CLASP_MIGRATION_STRESS_KEYS=K keys (default 400,000).
"""

from __future__ import annotations

import os
import random
import threading

import pytest

import clasp
from tests.cluster.test_order_stress import chain
from tests.conftest import start_cluster

SEEDS = int(os.environ.get("CLASP_MIGRATION_STRESS_SEEDS", "3"))
KEYS = int(os.environ.get("CLASP_MIGRATION_STRESS_KEYS", "400000"))
WORKERS = 4
CHUNK = 20_000


def key_of(r: str) -> str:
    return r.split(" ", 1)[0]


def order(state, r):
    return chain(state or 1, int(r.split(" ", 1)[1])), None


def build_dag() -> clasp.Dag:
    dag = clasp.Dag("migration-stress")
    dag.operator("order", order, stateful=True, key=key_of)
    return dag


def generate(rng: random.Random) -> list[str]:
    """Every key once (the state to move), then as many records again on random keys, some keys many times."""
    keys = [f"k{i}" for i in range(KEYS)]
    rng.shuffle(keys)
    hot = keys[:100]
    tail = [rng.choice(hot) if rng.random() < 0.2 else rng.choice(keys) for _ in range(KEYS)]
    return [f"{k} {seq}" for seq, k in enumerate(keys + tail)]


def reference(records: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        k, seq = r.split(" ", 1)
        out[k] = chain(out.get(k, 1), int(seq))
    return out


def spread(job, n: int) -> dict:
    """The key groups evenly over the first n workers: each change moves a large share of the state."""
    return job.place({"order": {i: 1.0 for i in range(n)}})


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory):
    c = start_cluster(tmp_path_factory, WORKERS, planner_args=["--no-autoscale", "--migration-timeout", "120"])
    yield c
    c.stop()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_every_key_keeps_its_order_across_migrations_of_400k_keys_under_load(cluster4, seed):
    rng = random.Random(seed)
    records = generate(rng)
    with clasp.connect(cluster4.planner, timeout=120) as client, \
            clasp.connect(cluster4.planner, timeout=120) as pusher:
        job = client.submit(build_dag(), autoscale=False)
        try:
            assert not spread(job, 1)["failed"]
            first = KEYS // 2
            job.push(records[:first])  # the state on one worker to start with: the first moves are big
            job.wait_idle(timeout=300)
            done, flowing = threading.Event(), threading.Event()
            failure: list[BaseException] = []
            pushed = [first]

            def push_rest():
                try:
                    j = pusher.job(job.id)
                    for i in range(first, len(records), CHUNK):
                        j.push(records[i:i + CHUNK])
                        pushed[0] = min(len(records), i + CHUNK)
                        flowing.set()
                except BaseException as e:  # reported by the test thread
                    failure.append(e)
                finally:
                    flowing.set()
                    done.set()

            t = threading.Thread(target=push_rest, daemon=True)
            t.start()
            flowing.wait(120)  # the first migration starts with records accepted and not yet run
            scales, moved, outstanding = [], [], []
            while not done.is_set() or len(scales) < 4:
                n = rng.choice([m for m in range(1, WORKERS + 1) if m != (scales[-1] if scales else 1)])
                scales.append(n)
                outstanding.append(pushed[0] - job.stats()["completed"])  # accepted, not yet complete
                record = spread(job, n)
                assert not record["failed"], record
                moved.append((record["objects"], record["rows"]))
            t.join()
            assert not failure, failure
            print(f"seed {seed}: scales {scales}, (keys, queued requests) moved {moved}, records in flight "
                  f"at each start {outstanding}")
            # the state moved, and migrations started while records were still on their way
            assert sum(k for k, _ in moved) >= first and max(outstanding) > 0
            job.wait_idle(timeout=300)
            stats = job.stats(fresh=True)
            assert stats["completed"] == len(records) and stats["lost"] == 0 and stats["failed"] == 0
            assert stats["operators"]["order"]["processed"] == len(records)
            want = reference(records)
            got = job.state("order")
            assert got.keys() == want.keys()
            bad = sorted(k for k, v in got.items() if want[k] != v)
            assert not bad, f"seed {seed}, scales {scales}: {len(bad)} keys out of order, e.g. {bad[:5]}"
        finally:
            job.cancel()
