"""The dashboard's views (clasp.core.dashboard, pure) and its HTTP side (clasp.runtime.dashboard) against a
real planner: the JSON API, the static page, the stream, read-only, built at most once a second."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

import clasp
from clasp.apps import wc
from clasp.core import dashboard as views
from clasp.core.routing import build_placement
from clasp.core.scheduler import WorkerInfo, job_stats
from clasp.runtime.dashboard import Dashboard, dumps
from tests.conftest import wait_for
from tests.unit.test_scheduler import FakeJob, stateful_spec, three_worker_placement, workers_with_samples


def test_cluster_view_has_status_queue_cpu_capacity_and_load():
    spec = stateful_spec()
    job = FakeJob(spec, three_worker_placement(), estimate={
        "alpha": 2.0, "beta": 10.0, "gamma": 100.0, "capacity": 1000.0, "capacities": {"w0": 500.0},
        "terms": {"alpha": "estimated"}, "observations": 3})
    workers = workers_with_samples()
    workers["w0"].sample["jobs"][4].update({"exec_us": 50.0, "r_local": 10.0, "r_remote": 1.0})
    workers["w2"] = WorkerInfo("w2", "h", "d2", "s2", "m2", 10, 3, 0.5, 0.0, alive=False)
    workers["w3"] = WorkerInfo("w3", "h", "d3", "s3", "m3", 10, 4, 0.7, 0.0)  # no heartbeat yet
    v = views.cluster_view(workers, {4: job}, 2.0, {"id": "p"})
    rows = {w["id"]: w for w in v["workers"]}
    assert [w["status"] for w in v["workers"]] == ["alive", "alive", "dead", "joining"]
    assert v["counts"] == {"alive": 2, "joining": 1, "draining": 0, "dead": 1}
    # Eq. (1): E + α·R^l + β·R^r + γ·δ = 50 + 2·10 + 10·1 + 100·2
    assert rows["w0"]["load"] == pytest.approx(280.0)
    assert rows["w0"]["capacity"] == 500.0 and rows["w1"]["capacity"] == 1000.0
    assert rows["w0"]["cpu"] == pytest.approx(9e-6) and rows["w0"]["queue"] == 0
    assert rows["w0"]["jobs"] == [4] and rows["w3"]["jobs"] == []
    assert v["models"][0]["terms"] == {"alpha": "estimated"} and v["models"][0]["alpha"] == 2.0


def test_job_view_graph_matrix_and_decision_results():
    spec = stateful_spec()
    job = FakeJob(spec, three_worker_placement(), series=[{"t": float(t), "throughput": 10.0 * t} for t in range(20)],
                  decisions=[{"t": 5.0, "trigger": "job.scale(2)", "reason": "r", "change": True, "workers": 2},
                             {"t": 9.0, "trigger": "x", "reason": "no", "change": False, "workers": None}],
                  migrations=[{"t": 5.1, "epoch": 4, "to_workers": 2, "from_workers": 3, "phases_ms": {},
                               "pauses": {}}])
    workers = workers_with_samples()
    v = views.job_view(job, workers, job_stats(job, workers, 2))
    g = v["graph"]
    assert [o["name"] for o in g["operators"]] == ["a", "b", "c"]
    assert g["operators"][0]["source"] and g["operators"][1]["stateful"] and g["operators"][0]["rate"] == 400.0
    ab = next(e for e in g["edges"] if (e["src"], e["dst"]) == ("a", "b"))
    # w0 sent 30/s, b's share on w0 is 0.5; w1 sent 12/s, b's share on w1 0.25
    assert ab["local"] == pytest.approx(15 + 3) and ab["remote"] == pytest.approx(15 + 9) and ab["rate"] == 42.0
    m = v["matrix"]
    assert m["workers"] == ["w0", "w1", "w2"] and m["operators"] == ["a", "b", "c"]
    assert m["cells"][1] == [[0.5, 64, 1], [0.25, 32, 1], [0.25, 32, 1]] and m["cells"][2][1] == [1.0, 0, 4]
    d = v["decisions"]
    assert d[0]["result_workers"] == 2 and d[0]["result_throughput"] == pytest.approx(105.0)  # t = 8..13
    assert "result_workers" not in d[1]
    assert "phases_ms" not in v["migrations"][0] and "operators" not in v["workers"]["w0"]
    json.loads(dumps(v))


def test_job_view_carries_the_checkpoints_section_of_the_job_stats():
    job, workers = FakeJob(stateful_spec(), three_worker_placement()), workers_with_samples()
    ckpt = {"completed": 41, "failed": 0, "recoveries": 1, "last_recovery": {"checkpoint": 40, "replayed": 7}}
    v = views.job_view(job, workers, {**job_stats(job, workers, 2), "checkpoints": ckpt})
    assert v["checkpoints"] == ckpt
    assert views.job_view(job, workers, {**job_stats(job, workers, 2), "checkpoints": None})["checkpoints"] is None


def test_dumps_turns_non_finite_numbers_into_null():
    assert json.loads(dumps({"a": float("inf"), "b": [float("nan"), 1.5], 3: (1,)})) == {"a": None, "b": [None, 1.5],
                                                                                          "3": [1]}


def big_job(n_workers: int = 100, n_ops: int = 50):
    dag = clasp.Dag("big")
    ops = [dag.operator(f"op{i}", lambda v: v, stateful=i % 5 == 4, key=(lambda v: v) if i % 5 == 4 else None)
           for i in range(n_ops)]
    for a, b in zip(ops, ops[1:], strict=False):
        a >> b
    spec = dag.to_spec()
    wids = [f"w{i}" for i in range(n_workers)]
    shares = {o.name: {i: 1.0 / n_workers for i in range(n_workers)} for o in spec.operators}
    placement = build_placement(spec, wids, shares, 10)
    workers = {}
    for i, w in enumerate(wids):
        js = {"queue": 3, "exec_us": 1000.0, "r_local": 10.0, "r_remote": 5.0,
              "operators": {o.name: {"rate": 10.0, "tau_us": 2.0, "processed": 100, "errors": 0, "queue": 1}
                            for o in spec.operators},
              "edges": [{"src": a, "dst": b, "rate": 10.0} for a, b in spec.edges()]}
        workers[w] = WorkerInfo(w, "h", "d", "s", "m", 10, i, float(i), 0.0,
                                sample={"delta": 3, "cpu_us": 5e5, "queue": 3, "jobs": {1: js}})
    job = FakeJob(spec, placement, id=1, workers=wids, estimate={"alpha": 1.3, "beta": 7.0, "gamma": 2e4,
                                                                   "capacity": 8e5},
                  series=[{"t": float(t), "throughput": 1.0, "input_rate": 1.0, "workers": 100, "p95": 0.01}
                          for t in range(600)])
    return job, workers


def test_views_at_100_workers_and_50_operators_build_in_well_under_a_second():
    job, workers = big_job()
    # The CPU this process spent, not the wall clock: the suite runs beside other tests' processes, whose
    # share of the cores is no cost of the views.
    t0 = time.process_time()
    c = dumps(views.cluster_view(workers, {1: job}, 0.0))
    j = dumps(views.job_view(job, workers, job_stats(job, workers, 100)))
    took = time.process_time() - t0
    v = json.loads(j)
    assert len(v["matrix"]["workers"]) == 100 and len(v["graph"]["operators"]) == 50
    assert len(json.loads(c)["workers"]) == 100
    assert took < 0.25, f"views took {took:.3f} s"  # once a second at most, on the planner's loop
    assert len(j) < 400_000, len(j)


# ----------------------------------------------------------------- the HTTP side
class FakeLoop:
    """call_soon_threadsafe on a thread of its own, counting the calls (the planner's loop)."""

    def __init__(self):
        self.calls = 0

    def call_soon_threadsafe(self, fn, *args):
        self.calls += 1
        threading.Thread(target=fn, args=args).start()


def call(app, path: str, method: str = "GET"):
    out = {}

    def start_response(status, headers):
        out["status"], out["headers"] = status, dict(headers)

    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": method, "QUERY_STRING": ""}, start_response))
    return out["status"], out["headers"], body


def test_views_are_cached_for_a_second_and_built_on_the_loop():
    loop = FakeLoop()
    d = Dashboard(loop, lambda key: {"key": key, "t": time.monotonic()} if key != "job/9" else None)
    app = d.app(lambda env, sr: (sr("200 OK", []), [b"metrics"])[1])
    s1 = call(app, "/api/cluster")
    s2 = call(app, "/api/cluster")
    assert s1[0] == "200 OK" and s1[2] == s2[2] and loop.calls == 1
    assert json.loads(s1[2])["key"] == "cluster"
    assert call(app, "/api/jobs/9")[0].startswith("404")
    assert call(app, "/api/jobs/x")[0].startswith("404")
    assert call(app, "/api/cluster", "POST")[0].startswith("405")
    assert call(app, "/metrics")[2] == b"metrics"
    assert call(app, "/static/../../etc/passwd")[0].startswith("404")
    status, headers, body = call(app, "/")
    assert status == "200 OK" and b"/static/app.js" in body and headers["Content-Type"].startswith("text/html")
    assert call(app, "/static/app.js")[0] == "200 OK"
    time.sleep(1.05)
    call(app, "/api/cluster")
    assert loop.calls == 3  # cluster, job/9, and cluster again after a second ("x" never reaches the loop)


def get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_the_api_of_a_running_planner(client3, cluster3):
    base = cluster3.dashboard
    assert base and base.endswith("/") and base.startswith("http://")
    job = client3.submit(wc.build_dag(), autoscale=False)
    job.push(["a b c"] * 100)
    job.wait_idle(timeout=30)
    # joining until its first heartbeat arrives
    c = wait_for(lambda: (lambda c: c["counts"]["alive"] == 3 and c)(get(base + "api/cluster")), what="3 alive")
    assert c["workers_total"] == 3
    jobs = get(base + "api/jobs")
    assert job.id in [j["job"] for j in jobs]
    j = get(base + f"api/jobs/{job.id}")
    assert [o["name"] for o in j["graph"]["operators"]] == ["split", "count"]
    assert j["completed"] == 100 or j["pushed"] == 100
    # checkpoints are on (the planner's default interval): the page's panel reads this section
    ckpt = wait_for(lambda: (lambda c: c and c["completed"] >= 1 and c)(get(f"{base}api/jobs/{job.id}")["checkpoints"]),
                    timeout=30, what="a completed checkpoint in /api/jobs/ID")
    now = job.stats()["checkpoints"]
    assert set(ckpt) == set(now) and ckpt["completed"] <= now["completed"], (ckpt, now)
    assert ckpt["failed"] == 0 and ckpt["interval_s"] == now["interval_s"] > 0
    with pytest.raises(urllib.error.HTTPError) as e:
        get(base + "api/jobs/999999")
    assert e.value.code == 404
    req = urllib.request.Request(base + "api/jobs", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405
    with urllib.request.urlopen(base + f"api/stream?job={job.id}", timeout=10) as s:
        lines = [s.readline() for _ in range(4)]
    assert lines[2] == b"event: update\n" and lines[3].startswith(b"data: ")
    update = json.loads(lines[3][6:])
    assert update["job"]["job"] == job.id and update["cluster"]["workers_total"] == 3
    with urllib.request.urlopen(base + "metrics", timeout=10) as r:
        assert b"clasp_workers_alive" in r.read()
    job.cancel()
