"""A worker's metrics monitor: the paper's Table 2 per interval, and Prometheus read at scrape time."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from clasp.runtime.engine import JobEngine
from clasp.runtime.operators import EXEC_BUCKETS


@dataclass
class _Cursor:
    """Cumulative counters at the previous sample, to turn them into per-interval rates."""

    processed: dict = field(default_factory=dict)
    exec_time: dict = field(default_factory=dict)
    edges: dict = field(default_factory=dict)
    group_hits: dict = field(default_factory=dict)
    local: int = 0
    remote: int = 0
    received: int = 0
    errors_seen: int = 0
    messages: tuple = (0, 0, 0, 0)


# Data messages per job, cumulative: sent to peers, rows in them, received from peers, rows in them.
MESSAGE_KEYS = ("sent", "sent_rows", "received", "received_rows")


CPU_BOUND = 0.9  # share of its CPU (quota, or one core for the executors' thread) that marks a worker saturated


class Monitor:
    """Samples every job's engine once per interval; `sample()` is what the heartbeat carries."""

    def __init__(self, worker_id: str):
        self.worker_id = worker_id
        self.jobs: dict[int, JobEngine] = {}
        self._cursors: dict[int, _Cursor] = {}
        self.bad_messages: Counter = Counter()
        self.destinations_interval: set[str] = set()  # distinct remote workers reached this interval
        self.last_delta = 0
        # Times the executor ran out of runnable work and waited for input this interval: none means the
        # worker was busy all along, i.e. saturated, however short its queue (the planner's window keeps
        # queues short, so queue growth and queueing delay rarely show saturation on this runtime).
        self.idle_waits = 0
        self.checkpoint_failures = 0  # snapshots this worker could not take or write, cumulative
        # job -> [sent, sent_rows, received, received_rows], cumulative; the data path adds one increment per
        # message (the server's `_flush_data` and `_data_loop`), never per row.
        self.messages: dict[int, list[int]] = {}
        self._cpu_last = time.process_time()
        self._loop_cpu_last = time.thread_time()  # the event loop's thread: sample() runs on it
        self.cpu_limit: float | None = None  # CPUs of this process's quota (the server keeps it current)
        self.cpus: float | None = None  # CPUs the worker was declared to have (`clasp worker --cpus`)
        self.last_cpu_us = 0.0  # U_w of the last interval, µs of CPU per second (for Prometheus)
        self.last_cpu_bound = False

    def job_messages(self, job: int) -> list[int]:
        """The cumulative data-message counters of `job` (created at zero), for the data path to increment."""
        c = self.messages.get(job)
        if c is None:
            c = self.messages[job] = [0, 0, 0, 0]
        return c

    def message_counts(self, job: int) -> dict[str, int]:
        """`job`'s cumulative data-message counters by name (what the `counters` reply carries)."""
        return dict(zip(MESSAGE_KEYS, self.messages.get(job, (0, 0, 0, 0)), strict=True))

    def sample(self, interval: float) -> dict:
        """Table 2 for the last `interval` seconds: Q_w, R^l, R^r, delta, N, tau, E, per job, and the remote chained
        requests received (r_in) and the worker's CPU time (cpu_us, cpu_bound); plus data messages
        sent and received per second (and rows in them), per job and for the worker."""
        interval = max(interval, 1e-6)
        self.last_delta = len(self.destinations_interval)
        cpu, loop = time.process_time(), time.thread_time()
        # Every thread of the process: ZeroMQ's I/O thread does part of the sending.
        cpu_us = (cpu - self._cpu_last) / interval * 1e6
        # CPU-bound: the process used its quota, or, unlimited, the one thread that runs every executor
        # used its core; then it is saturated however short its queue (clasp.core.control.observation).
        cpu_bound = (cpu_us >= CPU_BOUND * self.cpu_limit * 1e6 if self.cpu_limit
                     else (loop - self._loop_cpu_last) / interval >= CPU_BOUND)
        out = {"worker": self.worker_id, "interval": interval, "delta": self.last_delta,
               "idle_waits": self.idle_waits, "cpu_us": cpu_us, "cpu_bound": cpu_bound,
               # The CPU allowance the planner starts this worker's W_w from: declared, else its quota.
               "cpus": self.cpus or self.cpu_limit,
               "bad_messages": dict(self.bad_messages), "jobs": {}}
        self._cpu_last, self._loop_cpu_last = cpu, loop
        self.last_cpu_us, self.last_cpu_bound = cpu_us, cpu_bound
        self.idle_waits = 0
        self.destinations_interval = set()
        total_q = 0
        worker_msgs = [0.0, 0.0, 0.0, 0.0]
        for job, eng in list(self.jobs.items()):
            cur = self._cursors.setdefault(job, _Cursor())
            eng.fold_histograms()
            ops = {}
            for op in eng.ops:
                done = op.processed - cur.processed.get(op.name, 0)
                t = op.exec_time - cur.exec_time.get(op.name, 0.0)
                cur.processed[op.name], cur.exec_time[op.name] = op.processed, op.exec_time
                ops[op.name] = {"rate": done / interval, "tau_us": (t / done * 1e6) if done else 0.0,
                                "processed": op.processed, "queue": len(op.queue), "errors": op.errors,
                                "instances": op.instances, "keys": op.keys()}
            groups = {}
            for op in eng.ops:
                if op.stateful:
                    last = cur.group_hits.get(op.name) or [0] * len(op.group_hits)
                    now = list(op.hits())
                    moved = {g: (a - b) / interval for g, (a, b) in enumerate(zip(now, last, strict=True)) if a != b}
                    cur.group_hits[op.name] = now
                    if moved:
                        groups[op.name] = moved
            edges = []
            for op in eng.ops:
                for j, s in enumerate(op.successors):
                    name = (op.name, eng.ops[s].name)
                    c = op.edge_counts[j]
                    edges.append({"src": name[0], "dst": name[1], "rate": (c - cur.edges.get(name, 0)) / interval,
                                  "total": c})
                    cur.edges[name] = c
            rl = (eng.outbox.local_requests - cur.local) / interval
            rr = (eng.outbox.remote_requests - cur.remote) / interval
            r_in = (eng.received_requests - cur.received) / interval
            cur.local, cur.remote, cur.received = (eng.outbox.local_requests, eng.outbox.remote_requests,
                                                  eng.received_requests)
            q = eng.queue_length()
            total_q += q
            service = sum(o["rate"] for o in ops.values())
            samples = eng.executor.error_samples
            errors = list(samples)[cur.errors_seen:] if cur.errors_seen < len(samples) else []
            cur.errors_seen = len(samples)
            now_msgs = tuple(self.messages.get(job, (0, 0, 0, 0)))
            msgs = [(a - b) / interval for a, b in zip(now_msgs, cur.messages, strict=True)]
            cur.messages = now_msgs
            worker_msgs = [a + b for a, b in zip(worker_msgs, msgs, strict=True)]
            out["jobs"][job] = {
                "queue": q, "r_local": rl, "r_remote": rr, "r_in": r_in, "operators": ops, "edges": edges,
                # Little's law: the time a request arriving now waits behind the queue.
                "queue_delay": q / service if service > 0 else (float(q > 0) * interval),
                "exec_us": sum(o["rate"] * o["tau_us"] for o in ops.values()),
                "failed": eng.executor.failed, "new_errors": errors,
                # Data messages (and the rows in them) per second this interval, to and from other workers.
                "messages": dict(zip(MESSAGE_KEYS, msgs, strict=True)),
                # Requests per second this worker routed to each key group of each stateful operator
                # (only the groups that got any): the planner sums them into the groups' weights.
                "key_groups": groups}
        out["queue"] = total_q
        out["messages"] = dict(zip(MESSAGE_KEYS, worker_msgs, strict=True))
        return out


class WorkerCollector:
    """Prometheus collector over the monitor's engines: no Prometheus call on the request path."""

    def __init__(self, monitor: Monitor):
        self.m = monitor

    def collect(self):
        jobs = list(self.m.jobs.values())
        q = GaugeMetricFamily("clasp_worker_queue_length", "Requests queued on this worker (Q_w)")
        q.add_metric([], sum(e.queue_length() for e in jobs))
        yield q
        c = CounterMetricFamily("clasp_chained_requests", "Chained requests generated (R^l, R^r)", labels=["kind"])
        c.add_metric(["local"], sum(e.outbox.local_requests for e in jobs))
        c.add_metric(["remote"], sum(e.outbox.remote_requests for e in jobs))
        yield c
        cpu = CounterMetricFamily("clasp_worker_cpu_seconds", "CPU time of the worker process, every thread")
        cpu.add_metric([], time.process_time())
        yield cpu
        rate = GaugeMetricFamily("clasp_worker_cpu_rate", "CPU of the last interval in µs per second (U_w)")
        rate.add_metric([], self.m.last_cpu_us)
        yield rate
        bound = GaugeMetricFamily("clasp_worker_cpu_bound",
                                  "1 if the last interval used at least 90% of the worker's CPU (saturated)")
        bound.add_metric([], float(self.m.last_cpu_bound))
        yield bound
        quota = GaugeMetricFamily("clasp_worker_cpu_quota", "CPUs of the worker's cgroup quota (0: unlimited)")
        quota.add_metric([], self.m.cpu_limit or 0.0)
        yield quota
        d = GaugeMetricFamily("clasp_remote_destinations", "Distinct remote workers reached last interval (delta_w)")
        d.add_metric([], self.m.last_delta)
        yield d
        p = CounterMetricFamily("clasp_requests_processed", "Requests executed per operator",
                                labels=["job", "operator"])
        err = CounterMetricFamily("clasp_operator_errors", "Requests whose operator raised", labels=["job", "operator"])
        h = HistogramMetricFamily("clasp_execution_seconds", "Execution time per request",
                                  labels=["job", "operator"], unit="seconds")
        e = CounterMetricFamily("clasp_edge_requests", "Chained requests per DAG edge", labels=["job", "src", "dst"])
        for eng in jobs:
            j = str(eng.job)
            for op in eng.ops:
                p.add_metric([j, op.name], op.processed)
                err.add_metric([j, op.name], op.errors)
                cum, buckets = 0, []
                for bound, n in zip(EXEC_BUCKETS, op.hist, strict=False):
                    cum += n
                    buckets.append((repr(bound), cum))
                buckets.append(("+Inf", cum + op.hist[-1]))
                h.add_metric([j, op.name], buckets, op.exec_total)
                for k, s in enumerate(op.successors):
                    e.add_metric([j, op.name, eng.ops[s].name], op.edge_counts[k])
        yield p
        yield err
        yield h
        yield e
        cf = CounterMetricFamily("clasp_worker_checkpoint_failures",
                                 "Checkpoints whose snapshot this worker could not take or write")
        cf.add_metric([], self.m.checkpoint_failures)
        yield cf
        b = CounterMetricFamily("clasp_bad_messages", "Malformed, truncated or unknown messages dropped",
                                labels=["reason"])
        for reason, n in list(self.m.bad_messages.items()):
            b.add_metric([reason], n)
        if not self.m.bad_messages:
            b.add_metric(["none"], 0)
        yield b
