"""A checkpoint that fails on a worker is counted where the worker's other metrics are
(`clasp_worker_checkpoint_failures_total`), beside the planner's `clasp_checkpoints_total{outcome="failed"}`; the
planner serves `clasp_input_log_write_failures_total{job}` for every job with checkpoints, and the unit test of
the input log checks what it counts. The worker's checkpoints fail for real: where each one's directory
would go there is a file."""

from __future__ import annotations

import time
import urllib.request

import clasp
from tests.conftest import start_cluster, wait_for


def count(state, v):
    return (state or 0) + 1, None


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_worker_counts_the_checkpoints_it_could_not_snapshot(tmp_path_factory):
    cl = start_cluster(tmp_path_factory, 1, planner_args=["--no-autoscale", "--checkpoint-interval", "0.3"])
    try:
        with clasp.connect(cl.planner) as c:
            d = clasp.Dag("counts")
            d.operator("count", count, stateful=True, key=lambda v: v % 7)
            job = c.submit(d, autoscale=False)
            (cl.state_dir / f"job-{job.id}").mkdir(exist_ok=True)
            for k in range(1, 1000):
                try:
                    (cl.state_dir / f"job-{job.id}" / f"ckpt-{k}").write_text("not a directory")
                except IsADirectoryError:
                    pass  # the empty job's first checkpoint, taken as it was submitted
            job.push(list(range(100)))
            assert job.wait_idle(timeout=60)["completed"] == 100
            assert job.state("count") == {k: len(range(k, 100, 7)) for k in range(7)}
            wait_for(lambda: job.stats()["checkpoints"]["failed"] >= 2, timeout=30, what="two failed checkpoints")
            before = job.stats()["checkpoints"]["failed"]
            worker = scrape(cl.metrics["workers"][0])
            after = job.stats()["checkpoints"]["failed"]
            # The worker counts a failure before it answers; the planner counts it when the answer comes.
            assert before <= worker["clasp_worker_checkpoint_failures_total"] <= after + 1
            planner = scrape(cl.metrics["planner"])
            assert planner[f'clasp_input_log_write_failures_total{{job="{job.id}"}}'] == 0
            assert job.stats()["checkpoints"]["input_log_write_failures"] == 0
    finally:
        cl.stop()


def test_outputs_of_a_checkpoint_whose_manifest_cannot_be_written_are_released_by_the_next(tmp_path_factory):
    """The planner's commit of three checkpoints fails for real (where each one's COMPLETE.json would go there is
    a directory): those checkpoints count as failed, never as complete, and the outputs the workers handed over
    with them are released by the first checkpoint that completes, each exactly once."""
    cl = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--checkpoint-interval", "0.2"])
    try:
        with clasp.connect(cl.planner) as c:
            d = clasp.Dag("doubles")
            d.operator("double", lambda v: [2 * v], collect=True)
            job = c.submit(d, autoscale=False)
            # The empty job's first checkpoint is taken as it is submitted; no other comes before input.
            wait_for(lambda: job.stats()["checkpoints"]["completed"] >= 1, timeout=10, what="the first checkpoint")
            first = job.stats()["checkpoints"]["last_id"] + 1
            for k in (first, first + 1, first + 2):
                (cl.state_dir / f"job-{job.id}" / f"ckpt-{k}" / "COMPLETE.json").mkdir(parents=True)
            for i in range(0, 3000, 100):
                job.push(list(range(i, i + 100)))
                time.sleep(0.03)
            job.wait_idle(timeout=60)
            wait_for(lambda: job.stats()["checkpoints"]["failed"] >= 3, timeout=30, what="three failed commits")
            wait_for(lambda: sorted(job.collected("double")) == [2 * v for v in range(3000)], timeout=30,
                     what="every output released")
            ck = job.stats()["checkpoints"]
            assert ck["failed"] == 3 and ck["last_id"] > first + 2 and ck["completed"] == ck["last_id"] - 3
            assert len(job.collected("double")) == 3000
    finally:
        cl.stop()
