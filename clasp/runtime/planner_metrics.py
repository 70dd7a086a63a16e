"""The planner's Prometheus view (`clasp_planner_*`, `clasp_input_rate`, migrations, checkpoints, ...),
read from the planner's tables and collaborators at scrape time."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from clasp.core.tracking import LatencyHistogram


class PlannerCollector:
    """Prometheus view of the planner, read at scrape time."""

    def __init__(self, planner):
        self.p = planner

    def collect(self):
        p = self.p
        g = GaugeMetricFamily("clasp_planner_queue_length", "Records waiting in the planner's queue (Q_p)")
        g.add_metric([], sum(j.queued for j in list(p.jobs.values())))
        yield g
        qr = GaugeMetricFamily("clasp_planner_queued_records", "Records accepted and not yet dispatched, per job",
                               labels=["job"])
        qb = GaugeMetricFamily("clasp_planner_queued_bytes", "Bytes of the records accepted and not yet dispatched "
                               "(their push frames' bytes plus a per-record overhead), per job", labels=["job"])
        fr = GaugeMetricFamily("clasp_planner_inflight_records", "Records dispatched and not complete, per job",
                               labels=["job"])
        fw = GaugeMetricFamily("clasp_planner_inflight_window", "The most records a job may have in flight "
                               "(--max-inflight, or 10,000 per worker it spans)", labels=["job"])
        for j in list(p.jobs.values()):
            qr.add_metric([str(j.id)], j.queued)
            qb.add_metric([str(j.id)], j.queued_bytes)
            fr.add_metric([str(j.id)], j.inflight)
            fw.add_metric([str(j.id)], j.window)
        yield from (qr, qb, fr, fw)
        for name, value, doc in (("clasp_planner_max_queued_records", p.bound.max_records, "records"),
                                 ("clasp_planner_max_queued_bytes", p.bound.max_bytes, "bytes")):
            m = GaugeMetricFamily(name, f"Each job's bound on its queue, {doc}; pushes wait while it is reached")
            m.add_metric([], value)
            yield m
        for name, key, doc in (("clasp_input_rate", "input_rate", "Records entering per second (lambda_p)"),
                               ("clasp_throughput", "throughput", "Records completed end to end per second (Lambda)")):
            m = GaugeMetricFamily(name, doc)
            m.add_metric([], p.last_rates[key])
            yield m
        a = GaugeMetricFamily("clasp_workers_alive", "Registered workers sending heartbeats")
        a.add_metric([], len(p.live_workers()))
        yield a
        jobs = list(p.jobs.values())
        act = GaugeMetricFamily("clasp_workers_active", "Workers holding operators of the job", labels=["job"])
        for j in jobs:
            act.add_metric([str(j.id)], len(j.placement.active_workers()))
        yield act
        for key, doc in (("alpha", "µs per local chained request (α)"), ("beta", "µs per remote chained request (β)"),
                         ("gamma", "µs/s per remote destination (γ)"), ("capacity", "Worker capacity W̄, µs/s")):
            m = GaugeMetricFamily(f"clasp_model_{key}", f"Current estimate: {doc}", labels=["job"])
            for j in jobs:
                if key in j.estimate:
                    m.add_metric([str(j.id)], j.estimate[key])
            yield m
        r = CounterMetricFamily("clasp_rescales", "Migrations carried out")
        r.add_metric([], p.migrations.rescales)
        yield r
        lost = CounterMetricFamily("clasp_records_lost", "Records given up on because a worker holding "
                                   "part of them died")
        lost.add_metric([], p.migrations.records_lost)
        yield lost
        yield from p.checkpoints.metrics(jobs, _buckets)
        yield from p.time.metrics(jobs)
        mh = HistogramMetricFamily("clasp_migration_duration_seconds",
                                   "Planner: plan issued to last completion; worker: plan received to resumed",
                                   labels=["role"])
        for role, hist in p.migrations.migration_hist.items():
            mh.add_metric([role], _buckets(hist, (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
                                                  2.5, 5.0, 10.0)), hist.sum)
        yield mh
        h = HistogramMetricFamily("clasp_end_to_end_latency_seconds",
                                  "From entering the planner until the record and all its chained requests are done")
        h.add_metric([], _buckets(p.latency, (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                              1.0, 2.5, 5.0, 10.0, 30.0)), p.latency.sum)
        yield h
        b = CounterMetricFamily("clasp_bad_messages", "Malformed, truncated or unknown messages dropped",
                                labels=["reason"])
        for reason, n in list(p.bad_messages.items()):
            b.add_metric([reason], n)
        if not p.bad_messages:
            b.add_metric(["none"], 0)
        yield b


def _buckets(hist: LatencyHistogram, edges: tuple[float, ...]) -> list[tuple[str, int]]:
    """Cumulative Prometheus buckets at `edges` from the fine internal histogram."""
    import numpy as np

    idx = np.searchsorted(hist.bounds, edges, side="right")
    cumsum = np.cumsum(hist.counts)
    out = [(repr(e), int(cumsum[i - 1]) if i > 0 else 0) for e, i in zip(edges, idx, strict=True)]
    out.append(("+Inf", int(hist.total)))
    return out
