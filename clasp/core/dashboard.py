"""What the web dashboard shows, as plain data built from state the planner already holds.

`cluster_view`, `jobs_view` and `job_view` are pure functions of the planner's worker registry and jobs
(`clasp.core.scheduler.WorkerInfo`, `JobView`); `clasp.runtime.dashboard` serves them as JSON at
`/api/cluster`, `/api/jobs` and `/api/jobs/ID` (docs/RUNTIME.md, "The dashboard"), built at most once a
second whatever the number of viewers. Nothing here is called on the planner's request path.

Figures the planner does not hold are derived, and named so:
- L_w, a worker's load under the model: Eq. (1) of its last heartbeat (E_w, R^l_w, R^r_w, δ_w, ...) with
  the job's estimated coefficients (`clasp.core.model.worker_capacity`), against W_w, the estimator's
  capacity for that worker (W̄ where it knows none apart);
- an edge's local and remote request rates: the rate each worker sent on it, split by the placement's
  share of the successor on that worker (σ_s(w) local, 1 − σ_s(w) remote, as Eq. (8) counts them);
- a decision's result: the next migration's worker count, and the mean throughput 3–8 s after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from clasp.core.model import worker_capacity
from clasp.core.scheduler import JobView, WorkerInfo

SERIES_KEPT = 600  # timeline points per job sent to the page (one a second: ten minutes)
RESULT_WINDOW = (3.0, 8.0)  # seconds after a decision over which its resulting throughput is averaged


def worker_status(w: WorkerInfo) -> str:
    """alive, joining (registered, no heartbeat sample yet), draining, or dead. A `status` or `draining`
    attribute, where the worker registry has one (the elastic pool), takes precedence."""
    status = getattr(w, "status", None)
    if isinstance(status, str) and status:
        return status
    if not w.alive:
        return "dead"
    if getattr(w, "draining", False):
        return "draining"
    return "alive" if w.sample else "joining"


def _num(v, default: float = 0.0) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else default


def model_load(js: Mapping, sample: Mapping, model: Mapping) -> float:
    """L_w of one job on one worker: Eq. (1) of the worker's last sample with the job's estimate."""
    msgs = js.get("messages") or {}
    return worker_capacity(_num(js.get("exec_us")), _num(js.get("r_local")), _num(js.get("r_remote")),
                           _num(sample.get("delta")), _num(model.get("alpha")), _num(model.get("beta")),
                           _num(model.get("gamma")), _num(js.get("r_in")),
                           _num(msgs.get("sent")) + _num(msgs.get("received")), _num(model.get("beta_receive")),
                           _num(model.get("mu")))


def _capacity(model: Mapping, wid: str) -> float | None:
    caps = model.get("capacities") or {}
    if wid in caps:
        return _num(caps[wid])
    return _num(model["capacity"]) if "capacity" in model else None


def cluster_view(workers: Mapping[str, WorkerInfo], jobs: Mapping[int, JobView], now: float,
                 planner: Mapping | None = None) -> dict:
    """The cluster: every worker with its status, queue, CPU, W_w and L_w (summed over jobs), and each
    job's estimator coefficients with what identifies them. `now`: monotonic seconds (heartbeat ages)."""
    rows = []
    counts = {"alive": 0, "joining": 0, "draining": 0, "dead": 0}
    jobs = list(jobs.values())
    for w in sorted(workers.values(), key=lambda w: w.registered):
        s = w.sample or {}
        status = worker_status(w)
        counts[status] = counts.get(status, 0) + 1
        load, capacity, held = 0.0, None, []
        for job in jobs:
            if w.id not in job.workers:
                continue
            js = (s.get("jobs") or {}).get(job.id) or {}
            model = job.estimate or {}
            if model:
                load += model_load(js, s, model)
                cap = _capacity(model, w.id)
                capacity = cap if capacity is None else min(capacity, cap)
            if w.id in job.placement.workers and any(sh.get(w.id) for sh in
                                                     (p.shares for p in job.placement.operators.values())):
                held.append(job.id)
        cpu_us = s.get("cpu_us")
        rows.append({"id": w.id, "status": status, "host": w.host, "pid": w.pid, "queue": s.get("queue", 0),
                     "cpu": _num(cpu_us) / 1e6 if cpu_us is not None else None, "cpus": s.get("cpus"),
                     "cpu_bound": bool(s.get("cpu_bound")), "capacity": capacity, "load": load,
                     "jobs": held, "last_seen_s": round(max(now - w.last_seen, 0.0), 1), "metrics": w.metrics})
    models = []
    for job in jobs:
        m = job.estimate or {}
        models.append({"job": job.id, "name": job.spec.name,
                       **{k: m.get(k) for k in ("alpha", "beta", "beta_receive", "mu", "gamma", "capacity",
                                                 "flush_delay", "observations", "reason")},
                       "terms": dict(m.get("terms") or {}), "saturated": list(m.get("saturated") or []),
                       "capacities": dict(m.get("capacities") or {})})
    return {"workers": rows, "counts": counts, "workers_total": len(rows), "models": models,
            "jobs": len(jobs), "planner": dict(planner or {})}


def job_summary(job: JobView) -> dict:
    """One line of `/api/jobs`."""
    last = job.last or {}
    return {"job": job.id, "name": job.spec.name, "pushed": job.counters["pushed"],
            "completed": job.tracker.completed, "queued": job.queued, "input_rate": last.get("input_rate", 0.0),
            "throughput": last.get("throughput", 0.0), "workers": len(job.placement.active_workers()),
            "operators": len(job.spec.operators), "epoch": job.placement.epoch, "autoscale": job.autoscale}


def jobs_view(jobs: Mapping[int, JobView]) -> list[dict]:
    return [job_summary(j) for j in jobs.values()]


def placement_matrix(wire: Mapping, operators: Sequence[str]) -> dict:
    """The placement as operators × workers: per cell the share σ_o(w), the key groups held (count), and
    the instances; workers in the placement's order, only those holding something."""
    ops = wire.get("operators", {})
    held = [w for w in wire.get("workers", []) if any(ops.get(o, {}).get("shares", {}).get(w) for o in operators)]
    cells = []
    for o in operators:
        p = ops.get(o, {})
        shares, inst = p.get("shares", {}), p.get("instances", {})
        groups: dict[str, int] = {}
        for g in p.get("key_groups") or []:
            groups[g] = groups.get(g, 0) + 1
        cells.append([[round(_num(shares.get(w)), 4), groups.get(w, 0), int(inst.get(w, 0))] for w in held])
    return {"operators": list(operators), "workers": held, "cells": cells, "epoch": wire.get("epoch"),
            "cell": ["share", "key_groups", "instances"]}


def edge_split(stats_workers: Mapping[str, Mapping], wire: Mapping) -> dict[tuple[str, str], list[float]]:
    """(src, dst) -> [local, remote] requests/s: each worker's rate on the edge split by σ_dst(w)."""
    ops = wire.get("operators", {})
    out: dict[tuple[str, str], list[float]] = {}
    for wid, row in stats_workers.items():
        for e in row.get("edges", ()):
            rate = _num(e.get("rate"))
            if rate <= 0:
                continue
            local = _num(ops.get(e["dst"], {}).get("shares", {}).get(wid))
            acc = out.setdefault((e["src"], e["dst"]), [0.0, 0.0])
            acc[0] += rate * local
            acc[1] += rate * (1.0 - local)
    return out


def decision_results(decisions: Sequence[Mapping], migrations: Sequence[Mapping],
                     series: Sequence[Mapping]) -> list[dict]:
    """Every decision with what followed: the first migration at or after it (its resulting worker count,
    planner duration and largest worker pause) and the mean throughput RESULT_WINDOW s later."""
    out = []
    for d in decisions:
        t = _num(d.get("t"))
        row = dict(d)
        if d.get("change"):
            m = next((m for m in migrations if _num(m.get("t")) >= t - 0.5), None)
            if m is not None:
                row["result_workers"] = m.get("to_workers")
                row["migration_epoch"] = m.get("epoch")
            after = [_num(p.get("throughput")) for p in series
                     if t + RESULT_WINDOW[0] <= _num(p.get("t")) <= t + RESULT_WINDOW[1]]
            row["result_throughput"] = sum(after) / len(after) if after else None
        out.append(row)
    return out


def job_view(job: JobView, workers: Mapping[str, WorkerInfo], stats: Mapping) -> dict:
    """`/api/jobs/ID`: the job's `stats` (what `job.stats()` returns, its `checkpoints` section included)
    with the DAG as a graph, the placement matrix, and decisions with their results."""
    names = [o.name for o in job.spec.operators]
    split = edge_split({wid: {"edges": ((workers[wid].sample.get("jobs") or {}).get(job.id) or {}).get("edges", ())}
                        for wid in job.workers if wid in workers and workers[wid].sample}, stats["placement"])
    sources = {job.spec.operators[i].name for i in job.spec.sources}
    ops = stats["operators"]
    graph_ops = [{"name": o.name, "stateful": o.stateful, "source": o.name in sources, **ops.get(o.name, {})}
                 for o in job.spec.operators]
    rates = {(e["src"], e["dst"]): e["rate"] for e in stats["edges"]}
    graph_edges = []
    for s, d in job.spec.edges():
        local, remote = split.get((s, d), (0.0, 0.0))
        graph_edges.append({"src": s, "dst": d, "rate": rates.get((s, d), 0.0), "local": local, "remote": remote})
    # The per-worker rows without their per-operator copies (the graph has the sums): 100 × 50 less to send.
    per_worker = {wid: {k: v for k, v in row.items() if k != "operators"} for wid, row in stats["workers"].items()}
    migrations = [{k: v for k, v in m.items() if k not in ("phases_ms", "pauses")} for m in stats["migrations"]]
    series = list(job.series)[-SERIES_KEPT:]
    out = {k: v for k, v in stats.items() if k not in ("workers", "placement", "series", "migrations")}
    out.update({"graph": {"operators": graph_ops, "edges": graph_edges}, "workers": per_worker,
                "matrix": placement_matrix(stats["placement"], names), "series": series,
                "migrations": migrations,
                "decisions": decision_results(stats["decisions"], stats["migrations"], series)})
    return out
