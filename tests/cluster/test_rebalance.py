"""Key groups rebalanced by measured load on real processes: a keyed operator fed a skewed input on two
workers, autoscaling off, has its hot groups' owner relieved by a live migration, and every count is exact."""

from __future__ import annotations

import collections
import random
import time

import pytest

import clasp
from clasp.core.routing import key_group
from tests.conftest import start_cluster, wordcount_dag


def skewed_lines(owners: list[str], n: int, seed: int) -> list[str]:
    """Lines whose words are mostly a few hot words all owned by `owners[0]`'s worker (about 80 % of the
    requests where its share is half), the rest spread over every group."""
    busy = owners[0]
    hot = [w for w in (f"hot{i}" for i in range(400)) if owners[key_group(w)] == busy][:6]
    cold = [f"c{i}" for i in range(3000)]
    rng = random.Random(seed)
    return [" ".join(rng.choice(hot) if rng.random() < 0.6 else rng.choice(cold) for _ in range(12))
            for _ in range(n)]


def busy_part(counts: collections.Counter, owners: list[str], worker: str) -> float:
    total = sum(counts.values())
    return sum(k for w, k in counts.items() if owners[key_group(w)] == worker) / total


@pytest.mark.parametrize("rebalance", [True, False])
def test_a_skewed_keyed_stage_is_rebalanced_live_with_exact_counts(tmp_path_factory, rebalance):
    cluster = start_cluster(tmp_path_factory, 2, planner_args=[
        "--no-autoscale", "--heartbeat", "0.2", "--checkpoint-interval", "0.5",
        *([] if rebalance else ["--no-rebalance"])])
    try:
        with clasp.connect(cluster.planner) as c:
            job = c.submit(wordcount_dag("skew"), autoscale=False)
            before = job.stats()["placement"]["operators"]["count"]["key_groups"]
            busy = before[0]
            assert len(set(before)) == 2
            sent: collections.Counter = collections.Counter()
            seed = 0
            deadline = time.monotonic() + (20 if rebalance else 4)
            while time.monotonic() < deadline:
                lines = skewed_lines(before, 2000, seed)
                seed += 1
                job.push(lines)
                sent.update(w for line in lines for w in line.split())
                if rebalance and job.stats()["migrations"]:
                    break
                time.sleep(0.05)
            for s in range(seed, seed + 3):  # more input after the move, on the new owners
                lines = skewed_lines(before, 2000, s)
                job.push(lines)
                sent.update(w for line in lines for w in line.split())
            job.wait_idle(60)
            stats = job.stats()
            after = stats["placement"]["operators"]["count"]["key_groups"]
            assert job.state("count") == dict(sent)
            assert busy_part(sent, before, busy) > 0.75
            if not rebalance:
                assert stats["migrations"] == [] and after == before
                return
            (m,) = stats["migrations"]
            assert m["reason"].startswith("key groups rebalanced by measured load") and m["key_groups_moved"] > 0
            assert m["failed"] == {} and stats["epoch"] == 1
            assert [d for d in stats["decisions"] if d["trigger"] == "keyed load skewed"]
            assert after != before and set(after) == set(before)
            assert all(before[g] == busy for g in range(len(after)) if after[g] != before[g])  # off the busy one
            assert busy_part(sent, after, busy) < 0.6  # each owner near its half of the requests
    finally:
        cluster.stop()
