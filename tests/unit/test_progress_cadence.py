"""When a worker reports its progress counts: a worker that runs out of work reports at once, unless it
reported less than `PROGRESS_IDLE_GAP_S` ago, and then when that much has passed (its executor loop wakes
for it). A real engine runs real requests; the reports go over a real DEALER to a ROUTER in this process."""

from __future__ import annotations

import zmq

import clasp
from clasp.core import protocol
from clasp.core.routing import build_placement
from clasp.runtime.config import WorkerConfig
from clasp.runtime.engine import JobEngine
from clasp.runtime.worker import PROGRESS_IDLE_GAP_S, Worker


def _engine() -> JobEngine:
    dag = clasp.Dag("cadence")
    dag.operator("inc", lambda v: v + 1)
    spec = dag.to_spec()
    return JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"inc": {0: 1}}, 10))


def _run(eng: JobEngine, first: int, n: int) -> None:
    eng.receive_runs(eng.epoch, [[0, first, list(range(n))]])
    while eng.run_round():
        pass


def _reports(router: zmq.Socket) -> list:
    out = []
    while router.poll(200, zmq.POLLIN):
        _, frame = router.recv_multipart()
        out.append(protocol.decode(frame))
    return out


def test_an_idle_worker_reports_at_once_or_one_gap_after_its_last_report():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind("inproc://planner")
    worker = Worker(WorkerConfig(planner="inproc://planner", worker_id="w0"))
    worker.dealer = ctx.socket(zmq.DEALER)  # a blocking socket here: the worker only sends on it
    worker.dealer.connect("inproc://planner")
    eng = worker.jobs[1] = _engine()
    try:
        _run(eng, 0, 10)
        assert worker._flush_progress_idle(100.0) is None  # never reported: at once
        [(mtype, body)] = _reports(router)
        assert mtype == "done" and body[0] == 1 and body[1] == {0: {0: -10}}
        sent = worker._progress_sent

        _run(eng, 10, 5)  # out of work again right after that report: not yet, at the gap's end
        due = worker._flush_progress_idle(sent + PROGRESS_IDLE_GAP_S / 10)
        assert due == sent + PROGRESS_IDLE_GAP_S
        assert _reports(router) == [] and eng.executor.progress == {0: {0: -5}}
        assert worker._flush_progress_idle(due) is None  # woken then, still idle: reports
        assert _reports(router) == [("done", [1, {0: {0: -5}}, 0])]  # nothing queued: not behind

        # Nothing gathered since: nothing to report, and no wake-up asked for.
        assert worker._flush_progress_idle(worker._progress_sent) is None
        assert _reports(router) == []
    finally:
        ctx.destroy(linger=0)
