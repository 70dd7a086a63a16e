"""A real Prometheus scrapes a local cluster through `--prometheus-sd`'s file, a late worker included; the
Grafana dashboard's queries use only metrics a live cluster serves; the probes answer."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import clasp
from clasp.apps import wc
from clasp.local.cluster import LocalCluster
from tests.conftest import wait_for

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "clasp.json"
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def served(urls) -> set[str]:
    names = set()
    for u in urls:
        for line in _get(u)[1].splitlines():
            if line and not line.startswith("#"):
                names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def dashboard_metrics() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert exprs
    return {m for e in exprs for m in re.findall(r"\bclasp_[a-z_]+", e)}


@pytest.fixture
def elastic_cluster(tmp_path):
    sd = tmp_path / "targets.json"
    cl = LocalCluster(workers=1, port=0, log_dir=tmp_path / "logs", planner_args=["--no-autoscale"],
                      provider="local", max_workers=2, pool_cooldown=60, prometheus_sd=sd).start()
    yield cl, sd
    cl.stop()


def test_dashboard_queries_and_probes_use_what_a_live_cluster_serves(elastic_cluster):
    cl, sd = elastic_cluster
    with clasp.connect(cl.planner) as c:
        job = c.submit(wc.build_dag(), autoscale=False)
        job.push(wc.generate(3_000, seed=1))
        job.wait_idle(timeout=60)

        def not_served():
            names = served([cl.metrics["planner"], *[u for u in cl.metrics["workers"] if u]])
            return {m for m in dashboard_metrics() if m not in names and not any(m + s in names for s in SUFFIXES)
                    and not any(m.endswith(s) and m in names for s in SUFFIXES)}

        deadline = time.monotonic() + 10  # the workers' per-job series exist from their next heartbeat
        while (missing := not_served()) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not missing, f"the dashboard queries metrics no process serves: {sorted(missing)}"
    base = cl.metrics["workers"][0].rsplit("/", 1)[0]
    assert _get(base + "/healthz")[0] == 200 and _get(base + "/readyz")[0] == 200
    groups = json.loads(sd.read_text())
    assert {g["labels"]["clasp_process"] for g in groups} == {"planner", "w0"}


def test_a_real_prometheus_scrapes_the_planner_and_every_worker_a_late_one_included(elastic_cluster, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary on PATH: apt install prometheus (Debian and Ubuntu package it)")
    cl, sd = elastic_cluster
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: clasp
    file_sd_configs:
      - files: ["{sd}"]
        refresh_interval: 1s
""")
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115
    prom = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
    api = f"http://127.0.0.1:{port}/api/v1/query?query="

    def processes_with(metric: str) -> set[str]:
        try:
            status, body = _get(api + urllib.parse.quote(f"count by (clasp_process) ({metric})"), timeout=2)
        except OSError:
            return set()
        if status != 200:
            return set()
        return {r["metric"].get("clasp_process") for r in json.loads(body)["data"]["result"]}

    try:
        with clasp.connect(cl.planner) as c:
            job = c.submit(wc.build_dag(), autoscale=False)
            job.push(wc.generate(5_000, seed=2))
            job.wait_idle(timeout=60)
            record = job.scale(2)  # the local provider starts w1, which joins; the SD file names it
            assert record["to_workers"] == 2
            assert {g["labels"]["clasp_process"] for g in json.loads(sd.read_text())} == {"planner", "w0", "w1"}
            job.push(wc.generate(5_000, seed=3))
            job.wait_idle(timeout=60)
            wait_for(lambda: processes_with("clasp_throughput") == {"planner"}, timeout=60,
                     what="Prometheus scraping the planner's clasp_throughput")
            wait_for(lambda: processes_with("clasp_worker_queue_length") == {"w0", "w1"}, timeout=60,
                     what="Prometheus scraping both workers, the late w1 included")
            wait_for(lambda: {"w0", "w1"} <= processes_with('{__name__=~"clasp_requests_processed_total"}'),
                     timeout=30, what="per-operator series of both workers")
    finally:
        prom.terminate()
        prom.wait(timeout=10)
        log.close()
