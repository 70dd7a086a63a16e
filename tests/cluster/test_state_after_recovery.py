"""`state()` right after `wait_idle()` on a job whose workers were SIGKILLed: real processes, real kills.

`clasp cluster`'s set-up (4 workers, checkpoints every 0.5 s, a supervisor that restarts killed workers):
a keyed source keeping an order-sensitive hash of its records, a keyed inner operator doing the same and
collecting each record's sequence number, a stateless splitter and a keyed word counter; `job.scale(4)`;
records pushed from a thread in chunks of 2,000 every 50 ms. The second worker is killed after 1.5 s, the
third 2.5 s later. Then, per seed: no more kills; or one more worker killed once every record is done,
just before `wait_idle()` (which must wait for its recovery: it has nothing else to wait for); or more
records pushed and one more worker killed as soon as `wait_idle()` says they are done (the last checkpoint
may not hold them yet: the rollback reopens them and `state()` must wait for their replay). `wait_idle()`
must not return while a recovery or a restarted worker's rejoin is under way, and `state()` /
`collected()` called at once must wait for the job to serve again: every count exact, every key's hash
equal to the sequential reference, every output collected once, one recovery per kill.

CLASP_STRESS_SEEDS=N runs N seeds (default 3); CLASP_STRESS_RECORDS=M records per seed (default 100000,
and a fifth more for `after wait_idle`).
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
import urllib.request
from collections import Counter

import pytest

import clasp
from tests.cluster.test_order_stress import reference
from tests.cluster.test_recovery import _kill, build_dag, generate
from tests.conftest import start_cluster, wait_for

SEEDS = int(os.environ.get("CLASP_STRESS_SEEDS", "3"))
RECORDS = int(os.environ.get("CLASP_STRESS_RECORDS", "100000"))
CHUNK, PAUSE = 2000, 0.05
EXTRA_KILL = ("none", "before wait_idle", "after wait_idle")


def _recoveries_metric(url: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return float(re.search(r"^clasp_recoveries_total (\S+)$", text, re.M).group(1))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_state_right_after_wait_idle_is_exact_when_workers_were_killed(tmp_path_factory, seed):
    rng = random.Random(seed)
    extra = EXTRA_KILL[seed % len(EXTRA_KILL)]
    records = generate(RECORDS + (RECORDS // 5 if extra == "after wait_idle" else 0), rng)
    cluster = start_cluster(tmp_path_factory, 4, planner_args=["--checkpoint-interval", "0.5"])
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(build_dag())
            job.scale(4)

            def feed():
                with clasp.connect(cluster.planner) as c2:
                    j2 = c2.job(job.id)
                    for i in range(0, RECORDS, CHUNK):
                        j2.push(records[i:i + CHUNK])
                        time.sleep(PAUSE)

            feeder = threading.Thread(target=feed)
            feeder.start()
            time.sleep(1.5)
            _kill(client, "w1")
            time.sleep(2.5)
            _kill(client, "w2")
            feeder.join()
            if extra == "before wait_idle":  # every record done: a wait_idle that counted records would return
                # The kills so far recovered from first: a death during a rollback is rolled back in that same
                # recovery (one recovery for two kills), and this variant counts one per kill.
                def settled():
                    s = job.stats()
                    return (s["checkpoints"]["recoveries"] == 2 and len(s["checkpoints"]["serving"]) == 4
                            and s["outstanding"] == 0)
                wait_for(settled, timeout=120, interval=0.01, what="the recoveries over and every record done")
                _kill(client, rng.choice(["w0", "w3"]))
            summary = job.wait_idle(timeout=180)
            at_idle = job.stats()["checkpoints"]["recoveries"]  # every kill so far recovered from
            if extra == "after wait_idle":
                job.push(records[RECORDS:])
                summary = job.wait_idle(timeout=180)
                at_idle = job.stats()["checkpoints"]["recoveries"]
                _kill(client, rng.choice(["w0", "w3"]))
            counts = job.state("count")  # at once: no pause for the planner to notice anything
            got_src, got_inner = job.state("source_order"), job.state("inner_order")
            collected = job.collected("inner_order")
            src, inner, expected = reference(records)
            assert summary == {"pushed": len(records), "completed": len(records), "lost": 0}, summary
            assert counts == expected, f"seed {seed} ({extra}): counts differ"
            bad = sorted(k for k in src if got_src.get(k) != src[k] or got_inner.get(k) != inner[k])
            assert not bad, f"seed {seed} ({extra}): per-key order broken for {bad}"
            dup = [s for s, n in Counter(collected).items() if n > 1]
            assert not dup, f"seed {seed} ({extra}): {len(dup)} outputs collected twice, e.g. {dup[:5]}"
            assert sorted(collected) == list(range(len(records))), f"seed {seed} ({extra}): outputs missing"
            recoveries = job.stats()["checkpoints"]["recoveries"]
            kills = 2 if extra == "none" else 3
            assert at_idle == kills - (extra == "after wait_idle"), f"wait_idle returned at {at_idle} recoveries"
            assert recoveries == kills, recoveries
            assert _recoveries_metric(cluster.metrics["planner"]) == recoveries
    finally:
        cluster.stop()


def test_state_of_a_job_that_cannot_recover_times_out_saying_why(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, 1, planner_args=["--checkpoint-interval", "0.5"],
                            restart_workers=False)
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(build_dag())
            records = generate(2000, random.Random(1))
            job.push(records)
            job.wait_idle(timeout=60)
            t0 = time.monotonic()
            assert job.state("count") == reference(records)[2]
            assert time.monotonic() - t0 < 1.0  # a job that serves is answered at once
            _kill(client, "w0")
            t0 = time.monotonic()
            with pytest.raises(clasp.ClaspTimeout, match="lost every worker and waits for one to recover on"):
                job.state("count", timeout=3)
            assert 3 <= time.monotonic() - t0 < 6
            with pytest.raises(clasp.ClaspTimeout, match="lost every worker"):
                job.wait_idle(timeout=1)
    finally:
        cluster.stop()
