"""The planner's in-flight window on a real cluster: 10,000 records per worker the job spans (sources or
not), the dispatch batch per worker holding a source (`scheduler.dispatch_limits`), reported in
`job.stats()["in_flight"]` and Prometheus, never exceeded, and every record still exact."""

from __future__ import annotations

import time
import urllib.request

import clasp


def _chain() -> clasp.Dag:
    dag = clasp.Dag("window-chain")
    a = dag.operator("a", lambda v: v + 1)
    b = dag.operator("b", lambda v: v * 3)
    c = dag.operator("c", lambda v: v - 2, collect=True)
    a >> b >> c
    return dag


def test_a_chain_fed_by_one_worker_gets_a_window_for_every_worker_it_spans(client3):
    n = 60_000
    # The source on worker 0 only, the rest on the two others: one holder, three workers spanned.
    job = client3.submit(_chain(), placement={"a": {0: 1.0}, "b": {1: 1.0}, "c": {2: 1.0}}, autoscale=False)
    job.push(range(n))  # returns once the planner accepted them; they leave its queue a window at a time
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = job.stats()
        seen.append(s["in_flight"])
        if s["completed"] >= n:
            break
        time.sleep(0.01)
    job.wait_idle(60)
    assert sorted(job.collected("c")) == [(v + 1) * 3 - 2 for v in range(n)]
    assert {(f["window"], f["dispatch_batch"]) for f in seen} == {(30_000, 5000)}
    assert all(f["records"] <= f["window"] for f in seen)
    # More in flight than the window of the one source worker alone (10,000) allows, at some poll.
    assert max(f["records"] for f in seen) > 10_000
    job.cancel()


def test_a_spread_keeps_the_window_of_its_source_workers(client3, cluster3):
    job = client3.submit(_chain(), autoscale=False)  # every operator on every worker
    job.push(range(3000))
    job.wait_idle(60)
    assert job.stats()["in_flight"] == {"records": 0, "window": 30_000, "dispatch_batch": 7500}
    text = urllib.request.urlopen(cluster3.metrics["planner"]).read().decode()
    assert f'clasp_planner_inflight_window{{job="{job.id}"}} 30000.0' in text
    assert f'clasp_planner_inflight_records{{job="{job.id}"}} 0.0' in text
    assert sorted(job.collected("c")) == [(v + 1) * 3 - 2 for v in range(3000)]
    job.cancel()
