"""The emulated-cluster engine: one app on a real local cluster (planner + N worker processes), measured.

The figure harness (`clasp bench FIG --engine cluster`) and `clasp.bench.calibrate` / `clasp.bench.validate_sim` call
two functions; both return the same keys:

```python
unthrottled(app, workers, *, placement="spread", cpu_per_worker=None, records=None, seconds=8.0,
            state="local", seed=0, log_dir=None) -> dict
fixed_rate(app, workers, rate, *, placement="spread", cpu_per_worker=None, seconds=8.0,
           state="local", seed=0, log_dir=None) -> dict
```

- `app`: a name from `clasp.apps` (wc, sd, aa, pl, nwm, etl, syn); `workers`: the cluster's worker count.
- `placement`: "spread" (every operator over all `workers` with equal shares, what the simulator does
  by default: `clasp.core.policies.uniform_placement`) or an explicit `{op: {worker_index: fraction}}` (e.g. a
  policy's `PlacementResult.fractions`); operators it leaves out get the spread. Autoscaling is off.
- `cpu_per_worker`: a cgroup CPU quota per worker process (needs root; `clasp.local.cpulimit`), None unlimited.
- unthrottled: the planner queue is kept topped up (about a second of input ahead of the workers, so
  the workers never wait and the queueing latency stays bounded) for `seconds`, or until `records`
  records (default: enough for `seconds`, sized from a warm-up job) are all pushed. fixed_rate: a
  `constant:RATE` profile for `seconds` (`clasp.runtime.driver.Driver`).
- `state`: "local" or "remote" (the planner's state server, the Fig. 4 baseline).

Returned: `app`, `workers`, `throughput` (records/s completed end to end over the steady part: from
`warmup_s` after the first push to the end of the pushing, and, unthrottled, only while the planner queue
was non-empty, from the planner's exact completed counts), `latency` ({"p50", "p95", "p99"} in seconds:
the planner's histogram over every record of the run, queueing in the planner included; None when
nothing completed), `records` (records pushed), `correct` (the app's answer from the cluster equals its
independent `expected()` for exactly those records), `seconds` (the steady window's length); and, for
calibration and checks: `rate`, `placement`, `cpu_per_worker`, `state`, `completed`, `wall_s`,
`warmup_s`, `throughput_overall` (records / (first push → idle)), `cpu_s` (CPU seconds of each worker
process and the planner over the steady window, from /proc; `client_cpu_s`: this process's, the client
pushing the input), `throttle` (per quota-limited worker, the
cgroup's CFS counters over the same window: `nr_periods`, `nr_throttled`, `throttled_s`), `run_delay_s`
(per process, seconds its threads were runnable but waiting for a CPU over that window, summed over
threads; under a quota it evidently counts throttled time too, above 1 s/s for one saturated worker, so
it speaks of the host's other load only for the planner), `operators` ({op: {"processed", "tau_us"}},
exact counters), `per_worker` ({worker index: {"processed": {op: n}, "exec_s": {op: s}, "local",
"remote", "messages": {"sent", "sent_rows", "received", "received_rows"} (data messages to / from
other workers over the whole run), "window": the same counters, "local", "remote" and "processed" over
the steady window}}), `model` (the planner estimator's α, β, γ, W̄), `failed`, `exhausted` (unthrottled ran out of
records before `seconds`).

Clusters are reused: the first call for a (workers, cpu_per_worker) starts a `LocalCluster`, later calls
with the same pair submit a new job to it (each job is cancelled when measured, so no state carries over;
every (cluster, app) first runs a small warm-up job outside the measurement). Only `keep` clusters are
kept (default 1, so iterate the worker count in the outer loop); `shutdown()` stops them (also at exit).
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import tempfile
import time
from collections.abc import Mapping

from clasp.apps import get_app
from clasp.bench import cpu_seconds
from clasp.core.profiles import parse_profile
from clasp.runtime.config import WorkerConfig
from clasp.runtime.driver import Driver

WARMUP_RECORDS = 2000  # per (cluster, app), outside any measurement
AHEAD_S = 1.0  # unthrottled: keep this many seconds of input queued at the planner
MIN_AHEAD = 5000  # and at least this many records (the planner's in-flight window is 5,000)
SAMPLE_S = 0.2  # how often the planner's counters are sampled
MAX_RECORDS = 3_000_000


class EngineError(RuntimeError):
    """A measurement could not be made (bad argument, the job never went idle)."""


# ----------------------------------------------------------------------------- pure helpers
def spread(operators, workers: int) -> dict[str, dict[int, float]]:
    """Every operator over `workers` with equal shares (`clasp.core.policies.uniform_placement`'s fractions)."""
    from clasp.core.policies import uniform_placement

    return uniform_placement(list(operators), [], workers, 10, 1.0, "spread", "spread").fractions


def resolve_placement(placement: str | Mapping, operators, workers: int) -> dict[str, dict[int, float]]:
    """"spread" or an explicit {op: {worker index: fraction}} as a complete, checked placement."""
    operators = list(operators)
    base = spread(operators, workers)
    if isinstance(placement, str):
        if placement != "spread":
            raise EngineError(f"placement must be 'spread' or {{op: {{worker: fraction}}}}, not {placement!r}")
        return base
    if not isinstance(placement, Mapping):
        raise EngineError(f"placement must be 'spread' or a dict, not {type(placement).__name__}")
    unknown = sorted(set(placement) - set(operators))
    if unknown:
        raise EngineError(f"placement names unknown operator(s) {', '.join(unknown)}; the app has "
                          f"{', '.join(operators)}")
    out = dict(base)
    for op, shares in placement.items():
        clean = {int(w): float(f) for w, f in shares.items() if float(f) > 0}
        bad = [w for w in clean if not 0 <= w < workers]
        if bad or not clean:
            raise EngineError(f"placement of {op!r} must give positive shares to workers 0..{workers - 1}, "
                              f"got {dict(shares)!r}")
        total = sum(clean.values())
        out[op] = {w: f / total for w, f in sorted(clean.items())}
    return out


def steady_throughput(samples: list[tuple[float, int, int]], start: float, end: float,
                      saturated: bool) -> tuple[float | None, float]:
    """Records/s from (time, completed, planner queued) samples between `start` and `end`; with
    `saturated`, the window also ends at the last sample that still had a queue. (None, 0) if the
    window holds fewer than two samples or under 0.5 s."""
    inside = [s for s in samples if start <= s[0] <= end]
    if saturated:
        last = max((i for i, s in enumerate(inside) if s[2] > 0), default=None)
        # The sample after the last queued one still belongs to the saturated stretch only up to it.
        inside = inside[:last + 1] if last is not None else []
    if len(inside) < 2 or inside[-1][0] - inside[0][0] < 0.5:
        return None, 0.0
    (t0, c0, _), (t1, c1, _) = inside[0], inside[-1]
    return (c1 - c0) / (t1 - t0), t1 - t0


def cgroup_cpu_stat(pid: int) -> dict | None:
    """The CFS bandwidth counters of the cpu cgroup `pid` is in (`nr_periods`, `nr_throttled`,
    `throttled_s`), from cpu.stat (cgroup v1 or v2); None when it has no quota group or it cannot be read."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "cpu" in controllers.split(","):
            base = "/sys/fs/cgroup/cpu"
        elif controllers == "":
            base = "/sys/fs/cgroup"
        else:
            continue
        if path in ("", "/"):
            continue
        try:
            with open(f"{base}{path}/cpu.stat") as f:
                stat = dict(ln.split() for ln in f if ln.strip())
        except (OSError, ValueError):
            continue
        if "nr_periods" not in stat:
            continue
        throttled = (int(stat["throttled_usec"]) / 1e6 if "throttled_usec" in stat
                     else int(stat.get("throttled_time", 0)) / 1e9)
        return {"nr_periods": int(stat["nr_periods"]), "nr_throttled": int(stat["nr_throttled"]),
                "throttled_s": throttled}
    return None


def run_delay_seconds(pid: int) -> float:
    """Seconds the threads of `pid` have spent runnable but waiting for a CPU (/proc/PID/task/*/schedstat,
    second field): the machine's other load, as opposed to the process idling or being throttled."""
    total = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return math.nan
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return total


# ----------------------------------------------------------------------------- clusters
class Clusters:
    """Running LocalClusters by (workers, cpu_per_worker, flush_delay_ms, max_batch), with a client each; at most `keep`
    at a time."""

    def __init__(self, keep: int = 1):
        self.keep = keep
        self.running: dict[tuple, dict] = {}

    def get(self, workers: int, cpu_per_worker: float | None, log_dir=None,
            flush_delay_ms: float | None = None, max_batch: int | None = None) -> dict:
        import clasp
        from clasp.local.cluster import LocalCluster

        key = (int(workers), None if cpu_per_worker is None else
               float(cpu_per_worker) if isinstance(cpu_per_worker, int | float) else tuple(cpu_per_worker),
               None if flush_delay_ms is None else float(flush_delay_ms), max_batch)
        entry = self.running.pop(key, None)
        if entry is not None and not entry["cluster"].alive():
            self._stop(entry)
            entry = None
        if entry is None:
            while len(self.running) >= self.keep:
                self._stop(self.running.pop(next(iter(self.running))))
            logs = log_dir or tempfile.mkdtemp(prefix=f"clasp-engine-{workers}w-")
            batching = ({} if flush_delay_ms is None else {"flush_delay": flush_delay_ms / 1000.0}) | (
                {} if max_batch is None else {"max_batch": int(max_batch)})
            cl = LocalCluster(workers=workers, port=0, log_dir=logs, cpu_per_worker=cpu_per_worker,
                              worker_config=WorkerConfig(**batching)).start()
            client = clasp.connect(cl.planner, timeout=60)
            entry = {"cluster": cl, "client": client, "warm": {}, "logs": str(logs),
                     "pids": {w["id"]: w["pid"] for w in client.workers()}, "planner_pid": cl.procs[0].pid}
        self.running[key] = entry  # most recently used last
        return entry

    @staticmethod
    def _stop(entry: dict) -> None:
        try:
            entry["client"].close()
        finally:
            entry["cluster"].stop()

    def close(self) -> None:
        while self.running:
            self._stop(self.running.pop(next(iter(self.running))))


CLUSTERS = Clusters()
atexit.register(CLUSTERS.close)


def shutdown() -> None:
    """Stop every cluster this module started."""
    CLUSTERS.close()


# ----------------------------------------------------------------------------- measuring
class _Measured(Driver):
    """A Driver that samples the planner's exact completed count and queue every SAMPLE_S, and that,
    unthrottled, keeps the planner queue topped up instead of pushing every record at once."""

    def __init__(self, *a, deadline_s: float | None = None, warmup_s: float = 0.0,
                 pids: Mapping | None = None, **kw):
        super().__init__(*a, **kw)
        self.deadline_s = deadline_s
        self.warmup_s = warmup_s
        self.pids = dict(pids or {})
        self.samples: list[tuple[float, int, int]] = []
        self._last_sample = -math.inf
        self.cpu_start: dict | None = None  # (time, {process: CPU s}) at the steady window's start
        self.window_from_first_push = False  # the window opened at the first push, to move at `warmup_s`
        self.cpu_end: dict | None = None
        self._throttle: list[dict] = []  # CFS counters at the same two instants as cpu_start / cpu_end
        self._run_delay: list[dict] = []  # and run-queue waits
        self._counters: list[dict] = []  # and every worker's exact cumulative counters (data messages included)
        self._client: list[float] = []  # and this process's own CPU seconds (the client pushing the input)

    def _worker_counters(self) -> dict:
        try:
            st = self.job.stats(fresh=True)
        except Exception:  # noqa: BLE001 - a measurement aid: a failed ask leaves the window's counters out
            return {}
        return {wid: w.get("counters") or {} for wid, w in st.get("workers", {}).items()}

    def counters_window(self) -> dict:
        """Per worker id, the change over the `cpu_window` of its data-message counters (`messages`: sent,
        sent_rows, received, received_rows), chained requests (`local`, `remote`) and requests processed."""
        if self.cpu_start is None or self.cpu_end is None or len(self._counters) < 2:
            return {}
        a, b = self._counters[0], self._counters[-1]
        out = {}
        for wid, cb in b.items():
            ca = a.get(wid)
            if not ca or not cb:
                continue
            ma, mb = ca.get("messages", {}), cb.get("messages", {})
            out[wid] = {"messages": {k: mb[k] - ma.get(k, 0) for k in mb},
                        "local": cb.get("local", 0) - ca.get("local", 0),
                        "remote": cb.get("remote", 0) - ca.get("remote", 0),
                        "processed": sum(o["processed"] for o in cb.get("operators", {}).values())
                        - sum(o["processed"] for o in ca.get("operators", {}).values())}
        return out

    def _open_window(self) -> None:
        """The steady window starts now: the counters' first instant is this one."""
        for instants in (self._counters, self._throttle, self._run_delay, self._client):
            instants.clear()
        self.cpu_start = self._cpu()
        self.window_from_first_push = False

    def _cpu(self) -> tuple[float, dict]:
        self._counters.append(self._worker_counters())
        self._throttle.append({k: cgroup_cpu_stat(p) for k, p in self.pids.items()})
        self._run_delay.append({k: run_delay_seconds(p) for k, p in self.pids.items()})
        self._client.append(time.process_time())
        return time.monotonic(), {k: cpu_seconds(p) for k, p in self.pids.items()}

    def sample(self, force: bool = False) -> dict | None:
        now = time.monotonic()
        if not force and now - self._last_sample < SAMPLE_S:
            return None
        self._last_sample = now
        if ((self.cpu_start is None or self.window_from_first_push) and self.cpu_end is None
                and self.started is not None and now >= self.started + self.warmup_s):
            self._open_window()
        st = self.job.stats()
        self.samples.append((now, int(st["completed"]), int(st["queued"])))
        self.series.add(st.get("series", []))
        return st

    def poll(self, force: bool = False) -> dict | None:
        st = self.sample(force)
        return st if st is not None or not force else self.job.stats()

    def push_all(self) -> None:
        if not self.profile.unthrottled:
            super().push_all()
            self.cpu_end = self._cpu()
            return
        total = len(self.records)
        self.started = time.monotonic()
        if self.submitted_at is not None:
            self.series.offset = self.started - self.submitted_at
        first = min(total, 2 * MIN_AHEAD)
        # Opened at the first push and again `warmup_s` later: pushing that ends before then (a warm-up rate
        # read on a busy host sizes the run too small) is measured whole rather than over no window.
        self._open_window()
        self.window_from_first_push = True
        self.job.push(self.records[:first])
        self.sent = first
        while self.sent < total and time.monotonic() - self.started < self.deadline_s:
            time.sleep(SAMPLE_S / 2)
            st = self.sample()
            if st is None:
                continue
            rate = 0.0
            if len(self.samples) >= 3:
                (t0, c0, _), (t1, c1, _) = self.samples[-3], self.samples[-1]
                rate = (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0
            ahead = max(MIN_AHEAD, rate * AHEAD_S)
            if st["queued"] < ahead:
                upto = min(total, self.sent + int(2 * ahead - st["queued"]))
                self.job.push(self.records[self.sent:upto])
                self.sent = upto
        self.push_done = time.monotonic()
        self.cpu_end = self._cpu()
        self.sample(force=True)

    def cpu_window(self) -> tuple[dict, float]:
        """CPU seconds per process over [steady window start, end of pushing], and that window's length."""
        if self.cpu_start is None or self.cpu_end is None:
            return {}, 0.0
        (t0, c0), (t1, c1) = self.cpu_start, self.cpu_end
        return {k: round(c1[k] - c0[k], 4) for k in c1}, round(t1 - t0, 3)

    def client_cpu_window(self) -> float | None:
        """CPU seconds of this process (the client: pushing, sampling) over the `cpu_window`."""
        if self.cpu_start is None or self.cpu_end is None or len(self._client) < 2:
            return None
        return round(self._client[-1] - self._client[0], 4)

    def run_delay_window(self) -> dict:
        """Per process, seconds runnable but not running (waiting for a CPU) over the `cpu_window`."""
        if self.cpu_start is None or self.cpu_end is None or len(self._run_delay) < 2:
            return {}
        a, b = self._run_delay[0], self._run_delay[-1]
        return {k: round(b[k] - a[k], 4) for k in b if math.isfinite(b[k] - a.get(k, math.nan))}

    def throttle_window(self) -> dict:
        """Per quota-limited process, the CFS counters' change over the same window as `cpu_window`:
        periods, periods in which it was throttled, and seconds spent throttled."""
        if self.cpu_start is None or self.cpu_end is None or len(self._throttle) < 2:
            return {}
        a, b = self._throttle[0], self._throttle[-1]
        out = {}
        for k in b:
            if a.get(k) and b.get(k):
                out[k] = {"nr_periods": b[k]["nr_periods"] - a[k]["nr_periods"],
                          "nr_throttled": b[k]["nr_throttled"] - a[k]["nr_throttled"],
                          "throttled_s": round(b[k]["throttled_s"] - a[k]["throttled_s"], 4)}
        return out


def _warm(entry: dict, app, seed: int, state: str, placement: dict) -> float:
    """One small job of `app` on this cluster, outside any measurement; its records/s (a rough rate)."""
    key = (app.NAME, state)
    if key not in entry["warm"]:
        records = app.generate(WARMUP_RECORDS, seed + 7919)
        job = entry["client"].submit(app.build_dag(), placement=placement, autoscale=False, state=state)
        t0 = time.perf_counter()
        job.push(records)
        job.wait_idle(300)
        entry["warm"][key] = WARMUP_RECORDS / max(time.perf_counter() - t0, 1e-3)
        job.cancel()
    return entry["warm"][key]


@functools.cache
def _key_weights(app_name: str) -> dict[str, list[float]]:
    """The app's key-group weights counted on a local run (what the simulator routes by, `key_skew`), so a
    fixed placement's key groups are owned by weight, as the planner owns them once it measured them."""
    from clasp.apps import get_app
    from clasp.sim.simulator import measure_app

    return measure_app(get_app(app_name), 20_000)[1]


def _measure(app_name: str, workers: int, rate: float | None, *, placement, cpu_per_worker, records,
             seconds: float, state: str, seed: int, log_dir, flush_delay_ms: float | None = None,
             max_batch: int | None = None) -> dict:
    if workers < 1:
        raise EngineError(f"workers must be at least 1, not {workers}")
    if not seconds > 0:
        raise EngineError(f"seconds must be > 0, not {seconds}")
    if state not in ("local", "remote"):
        raise EngineError(f"state must be 'local' or 'remote', not {state!r}")
    app = get_app(app_name)
    ops = [o.name for o in app.build_dag().operators]
    fractions = resolve_placement(placement, ops, workers)
    entry = CLUSTERS.get(workers, cpu_per_worker, log_dir, flush_delay_ms, max_batch)
    client = entry["client"]
    warm_rate = _warm(entry, app, seed, state, fractions)
    warmup_s = min(2.0, 0.25 * seconds)
    if rate is None:
        # Enough for the whole run at 4x the warm-up's rate: a 2,000-record warm-up is mostly ramp and drain.
        n = records or int(min(MAX_RECORDS, max(4 * MIN_AHEAD, 4.0 * warm_rate * (seconds + 2))))
        profile = parse_profile("unthrottled", duration=seconds)
    else:
        if not rate > 0:
            raise EngineError(f"rate must be > 0 records/s, not {rate}")
        n = records or max(1, math.ceil(rate * seconds))
        profile = parse_profile(f"constant:{rate}", duration=seconds)
    inputs = app.generate(n, seed)
    submitted = time.monotonic()
    job = client.submit(app.build_dag(), placement=fractions, autoscale=False, state=state,
                        key_weights=_key_weights(app_name))
    try:
        # Placement index i is the i-th live worker in registration order: the job's own list.
        order = list(job.info["workers"])
        pids = {**{i: entry["pids"][w] for i, w in enumerate(order)}, "planner": entry["planner_pid"]}
        d = _Measured(job, app, inputs, profile, submitted_at=submitted, deadline_s=seconds, drain_timeout=300,
                      warmup_s=warmup_s, pids=pids)
        d.push_all()
        d.drain()
        d.verify()
        summary = d.summary()
        stats = job.stats(fresh=True)
    finally:
        job.cancel()
    start = d.started + warmup_s
    tput, window = steady_throughput(d.samples, start, d.push_done + 1e-6, saturated=rate is None)
    if tput is None:  # a short run: the whole run, start-up included
        tput, window = summary["records_per_s"] or 0.0, summary["duration_s"]
    cpu, cpu_window = d.cpu_window()
    throttle = d.throttle_window()
    run_delay = d.run_delay_window()
    window_counts = d.counters_window()
    lat = stats["latency"]
    latency = {k: lat.get(k) for k in ("p50", "p95", "p99")} if lat.get("count") else None
    index = {wid: i for i, wid in enumerate(order)}
    per_worker = {}
    for wid, w in sorted(stats["workers"].items(), key=lambda kv: index.get(kv[0], len(index))):
        c = w.get("counters") or {}
        per_worker[index.get(wid, wid)] = {
            "processed": {o: v["processed"] for o, v in c.get("operators", {}).items()},
            "exec_s": {o: v["exec_s"] for o, v in c.get("operators", {}).items()},
            "local": c.get("local", 0), "remote": c.get("remote", 0),
            # Data messages to and from other workers over the whole run (sent, sent_rows, received,
            # received_rows), and the same counters over the steady window only (`cpu_window_s`).
            "messages": dict(c.get("messages", {})), "window": window_counts.get(wid, {})}
    return {"app": app.NAME, "workers": workers, "throughput": tput, "latency": latency,
            "records": d.sent, "correct": bool(d.correct), "seconds": round(window, 3),
            "rate": rate, "placement": "spread" if isinstance(placement, str) else fractions,
            "cpu_per_worker": cpu_per_worker, "flush_delay_ms": flush_delay_ms, "max_batch": max_batch,
            "state": state,
            "completed": stats["completed"],
            "wall_s": summary["duration_s"], "warmup_s": warmup_s,
            "throughput_overall": summary["records_per_s"], "cpu_s": cpu, "cpu_window_s": cpu_window,
            "throttle": throttle, "run_delay_s": run_delay, "client_cpu_s": d.client_cpu_window(),
            "operators": {o: {"processed": v["processed"], "tau_us": v.get("tau_us_mean", 0.0)}
                          for o, v in stats["operators"].items()},
            "per_worker": per_worker, "model": stats.get("model", {}), "failed": stats["failed"],
            "exhausted": rate is None and d.sent >= len(inputs) and d.push_done - d.started < seconds}


def unthrottled(app: str, workers: int, *, placement="spread", cpu_per_worker: float | None = None,
                records: int | None = None, seconds: float = 8.0, state: str = "local", seed: int = 0,
                log_dir=None, flush_delay_ms: float | None = None, max_batch: int | None = None) -> dict:
    """All input pushed as fast as the planner accepts it (queue kept full) for `seconds`; see the module
    docstring for the keys. `flush_delay_ms` starts the workers with that `--flush-delay-ms` (None: the
    worker's default, 1 ms)."""
    return _measure(app, workers, None, placement=placement, cpu_per_worker=cpu_per_worker, records=records,
                    seconds=seconds, state=state, seed=seed, log_dir=log_dir, flush_delay_ms=flush_delay_ms,
                    max_batch=max_batch)


def fixed_rate(app: str, workers: int, rate: float, *, placement="spread", cpu_per_worker: float | None = None,
               seconds: float = 8.0, state: str = "local", seed: int = 0, log_dir=None) -> dict:
    """Input paced at `rate` records/s for `seconds` (a constant profile); same keys as `unthrottled`."""
    return _measure(app, workers, float(rate), placement=placement, cpu_per_worker=cpu_per_worker,
                    records=None, seconds=seconds, state=state, seed=seed, log_dir=log_dir)
