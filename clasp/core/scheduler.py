"""The planner's decisions, with no sockets and no event loop.

`clasp.runtime.planner.Planner` holds the sockets and the handler table; what it decides it asks of the
functions here, and then carries out (sends the frames, awaits the workers), the way dask's
`WorkerState.handle_stimulus` returns instructions and h11's `Connection` never touches a socket:

- `dispatch`: which queued records leave now (the in-flight window's arithmetic) and which worker's
  source operator gets each (`Dispatch`: keyed rows and stateless runs per destination); a stateless
  source's runs go to the worker with the fewest requests outstanding for its share (`Loads`).
- `plan_recovery`: a dead worker's share re-placed on the survivors, the fence below which records are
  suspected lost with it, and the decision recorded for the job.
- `sweep_step`: whether the suspects still open are now counted as lost (two clean checks in a row).
- `busy` and `unsettled`: whether `wait_idle` may return, and whether the job's workers may be asked for
  its state, from what the planner knows of the job (`JobCondition`).
- `job_stats`: a job's statistics, aggregated over its workers' samples or exact counters.
- `migration_record`: what one migration did, from the workers' replies.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from clasp.core.control import pool_order
from clasp.core.dag import DagSpec
from clasp.core.protocol import SEGMENT_RECORDS, Segments
from clasp.core.routing import (
    NUM_KEY_GROUPS,
    ROUTE_KEYED,
    ROUTE_LOCAL,
    ROUTE_TABLE,
    OperatorPlacement,
    Placement,
    PlacementError,
    Route,
    key_group,
    key_groups_for_shares,
)
from clasp.core.tracking import CHUNK_BITS, EPOCH_BITS, Tracker, add_range

PLANNER_WORKER = "planner"  # the "worker" named in errors that happened at the planner


@dataclass
class WorkerInfo:
    """A registered worker as the planner knows it; `sample` is its last heartbeat's metrics."""

    id: str
    host: str
    data: str
    state: str
    metrics: str
    p_max: int
    pid: int
    registered: float
    last_seen: float
    alive: bool = True
    sample: dict = field(default_factory=dict)


# ----------------------------------------------------------------- dispatch
@dataclass(slots=True)
class Dispatch:
    """One dispatch step: records `first .. first + count - 1` leave the planner's queue.

    `data`: destination -> rows `(op, value, key, rid)` for keyed sources; `runs`: destination -> runs
    `[op, first rid, values]` for stateless sources; `counts`: the requests sent, epoch -> {source
    operator: requests} (`clasp.core.tracking`); `failed`: rids whose key function raised (sent nowhere:
    they are done at once), with one `errors` entry each for the job's error list."""

    first: int
    count: int
    data: dict[str, list] = field(default_factory=dict)
    runs: dict[str, list] = field(default_factory=dict)
    counts: dict[int, dict[int, int]] = field(default_factory=dict)
    failed: list[int] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)


# A job's in-flight window and dispatch batch where the planner is not given them. A dispatch is cut into
# one message per worker holding a source, so the batch scales with those workers: a fixed batch spread
# over ten of them left each a few dozen records per message and a queue that kept running dry (measured
# on ten 0.1-CPU workers of a SYN spread, docs/RUNTIME.md "The in-flight window": 36 rows per message and
# 9.2 µs of worker CPU per record with 5,000 / 2,000 in all, 395 rows and 7.1–8.1 µs with these). The
# window scales with every worker the job spans (`Placement.active_workers`), sources or not: records in
# flight sit in the queues along their path, and each worker needs its own queued, wherever in the DAG it
# is (a ten-worker chain fed by one worker: +40 % over the holders' window, same section). A client's push is
# a chunk of up to 5,000 records: the batch takes a whole one at a time (one message per worker holding a
# source, not several), and the window holds four of them per worker, so that a worker has the next chunk
# while the planner waits for its progress report about the last (docs/RUNTIME.md, "The planner's cost
# per pushed line": 264 dispatch messages per 200,000 Word Count lines at 2 workers became 120-130). Each
# worker of a spread has what one worker alone has: a record that crosses workers takes longer to complete,
# and with one worker's window split two ways Word Count's two workers waited on it (docs/RUNTIME.md, "The
# in-flight window": 127,000-167,000 lines/s with 10,000 in flight, 175,000-182,000 with 20,000).
WINDOW_PER_WORKER = 10000
BATCH_PER_WORKER = 2500
WINDOW_MIN, BATCH_MIN = WINDOW_PER_WORKER, 5000  # the one-worker defaults, kept as the floor

# A busy worker reports its progress at its interval (`clasp.runtime.worker`, 25 ms) only once its push roots
# finished this many requests since its last report (a worker that runs a push root), else at most this long
# after the last: each report frees the planner's in-flight window (it dispatches once half a batch is free,
# `window_room`: a worker's part of a batch), and one that frees a few hundred records cost the planner as
# much as one that frees thousands (~100 µs where it runs, of which applying its counts is ~10). A worker
# slowed to 25,000 Word Count lines/s by its neighbours on the host sent a report per ~600 lines, 0.1-0.2 µs
# of planner CPU per line; with half a worker's part of a batch, two reports per dispatch step. Its window
# holds four such parts: reporting after two, it still has two queued while the planner sends the next (at
# one part, Word Count's busy reports at 2 workers were ~80 per 300,000 lines at 100,000 lines/s, at two
# ~45, and the planner's event loop 0.28 -> 0.21 µs a line: docs/RUNTIME.md, "seventh round").
PROGRESS_MIN_ROOTS = 2 * BATCH_PER_WORKER
PROGRESS_MAX_INTERVAL_S = 0.1


def progress_due(overdue: bool, roots_finished: int | None) -> bool:
    """Whether a busy worker reports a job's progress its interval after it began to gather: once its
    push roots finished PROGRESS_MIN_ROOTS requests here (`JobEngine.roots_finished`; None: it runs no push
    root, and reports at the interval), or `overdue` (PROGRESS_MAX_INTERVAL_S passed)."""
    return overdue or roots_finished is None or roots_finished >= PROGRESS_MIN_ROOTS


def dispatch_limits(max_inflight: int | None, dispatch_batch: int | None, holders: int,
                    spanned: int | None = None) -> tuple[int, int]:
    """(window, batch) of a job whose source operators are on `holders` workers and whose operators span
    `spanned` workers (default: the holders): a value the planner was given as it is; by default
    WINDOW_PER_WORKER per spanned worker and BATCH_PER_WORKER per holder, at least the one-worker
    WINDOW_MIN and BATCH_MIN."""
    n = max(1, holders)
    window = (max_inflight if max_inflight is not None
              else max(WINDOW_MIN, WINDOW_PER_WORKER * max(n, spanned or 0)))
    batch = dispatch_batch if dispatch_batch is not None else max(BATCH_MIN, BATCH_PER_WORKER * n)
    return window, batch


def source_holders(spec: DagSpec, placement: Placement) -> int:
    """How many workers hold a share of some source operator under `placement` (each gets its own message
    of every dispatch)."""
    return len({w for s in spec.sources for w in placement.operators[spec.operators[s].name].workers()})


def window_room(max_inflight: int, inflight: int, batch: int) -> int:
    """How many records may leave now: what the in-flight window has room for, at most one batch, and,
    while records are in flight, nothing until half a batch is free (so each worker's message is a batch's
    part, not the few records one completion freed; with nothing in flight anything goes at once)."""
    room = min(max_inflight - inflight, batch)
    if inflight > 0 and room < min(batch, max_inflight) // 2:
        return 0
    return room


class Loads:
    """Per worker, the source operators' requests dispatched to it and not reported finished there yet, and
    the work its last report said was queued past them: how far behind each worker is. Join the shortest
    queue, as load balancers do: a
    stateless source's next run goes to the worker with the least outstanding per unit of its share
    sigma, so a worker slowed by other work (a larger part of a keyed stage, a noisy neighbour) gets less
    and a fast one more, within the ~25 ms of a progress report; with equal loads the runs follow the
    shares. Kept per dispatch and per report, never per record. A worker's count is only as right as its
    reports: requests a migration hands to another worker are reported finished there, so a placement
    change starts the counts over (the shell builds a new `Loads`), as does a job with nothing in flight."""

    __slots__ = ("sources", "out", "behind")

    def __init__(self, sources: Sequence[int] = ()):
        self.sources = tuple(sources)  # the operator indices whose requests count (the push roots)
        self.out: dict[str, int] = {}
        # Per worker, its last report's work queued past the roots, in root requests (`JobEngine.behind`):
        # a root keeps up on a worker whose rounds it shares with a backlogged keyed stage, so its own
        # outstanding requests alone do not show that the worker is behind.
        self.behind: dict[str, int] = {}

    def sent(self, dest: str, n: int) -> None:
        self.out[dest] = self.out.get(dest, 0) + n

    def report(self, sender: bytes, deltas: Mapping[int, Mapping[int, int]], behind: int = 0) -> None:
        """A progress report of worker `sender`: its finished source requests leave its count (never
        below zero: a request handed over in a migration finishes at a worker it was not sent to), and
        `behind` replaces its backlog past the roots."""
        k = 0
        for d in deltas.values():
            for s in self.sources:
                k += d.get(s, 0)
        if k or behind or self.behind:
            w = sender.decode(errors="replace")
            if k:
                self.out[w] = max(0, self.out.get(w, 0) + k)
            self.behind[w] = behind

    def clear(self) -> None:
        self.out.clear()
        self.behind.clear()

    def pick(self, sigma: Mapping[str | None, float]) -> str:
        """The destination of `sigma` with the least outstanding (root requests and the backlog past them)
        per unit of share; the first in `sigma`'s order among equals (deterministic)."""
        out, behind = self.out, self.behind
        best, low = None, 0.0
        for w, share in sigma.items():
            v = (out.get(w, 0) + behind.get(w, 0)) / share
            if best is None or v < low:
                best, low = w, v
        return best


def route_sigma(route: Route) -> Mapping[str | None, float]:
    """A table route's shares: its own, else its table's slot counts (a route built by hand)."""
    if route.sigma:
        return route.sigma
    counts: dict = {}
    for w in route.period or route.table:
        counts[w] = counts.get(w, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: str(kv[0])))


def take(queue: deque, room: int) -> tuple[int, list]:
    """Take up to `room` records from the head chunk of the queue `[base rid, records, offset]` (Q_p);
    returns (first rid, records). A chunk leaves the queue when all its records did."""
    head = queue[0]
    base, records, offset = head
    if type(records) is Segments:  # whole segments only, at least one (it may overrun `room` by part of one)
        part = records.cut(offset, room)
        n = len(part)
    else:
        n = min(room, len(records) - offset)
        part = records[offset:offset + n]
    head[2] = offset + n
    if head[2] >= len(records):
        queue.popleft()
    return base + offset, part


def route_records(spec: DagSpec, routes: Sequence[Route], first: int, part: list,
                  loads: Loads | None = None) -> Dispatch:
    """Send every record of `part` (rids from `first`) to each source operator: keyed sources by the owner
    of the key's group, stateless ones in runs of consecutive records (so the planner builds and packs no
    row per record): with `loads`, runs of a segment's size each to the least loaded worker
    (`Loads.pick`, counted in `loads` as sent), else one block per slot of the weighted table's period (a
    batch split evenly over two workers is two runs); `counts` per epoch and operator, by ranges for runs."""
    n = len(part)
    d = Dispatch(first, n)
    out, runs, counts = d.data, d.runs, d.counts
    if type(part) is Segments:
        if any(route.kind != ROUTE_TABLE for route in routes):
            part = part.decoded()  # the shell decodes a keyed source's pushes first: not reached there
        else:
            _route_segments(routes, first, part, runs, counts, loads)
            return d
    for route in routes:
        s = route.succ
        if route.kind == ROUTE_KEYED:
            key_fn = spec.operators[s].key
            owners = route.owners
            before = {dest: len(rows) for dest, rows in out.items()}
            bad = []
            for i, v in enumerate(part):
                try:
                    key = key_fn(v)
                    g = key_group(key, NUM_KEY_GROUPS)
                except Exception as e:
                    bad.append(first + i)
                    d.errors.append({"worker": PLANNER_WORKER, "operator": spec.operators[s].name,
                                     "error": f"key function failed: {e!r}"[:300], "value": repr(v)[:200]})
                    continue
                out.setdefault(owners[g], []).append((s, v, key, first + i))
            add_range(counts, s, first, n)
            for rid in bad:  # sent nowhere: not outstanding at the operator
                counts[rid >> EPOCH_BITS][s] -= 1
            d.failed.extend(bad)
            if loads is not None:  # their finishing is reported as any source's: counted as sent
                for dest, rows in out.items():
                    loads.sent(dest, len(rows) - before.get(dest, 0))
        elif route.kind == ROUTE_LOCAL:  # cannot happen from the planner: it holds no operator
            raise PlacementError("a source routed to the planner")
        elif loads is not None:
            sigma = route_sigma(route)
            for start in range(0, n, SEGMENT_RECORDS):
                dest = loads.pick(sigma)
                block = part[start:start + SEGMENT_RECORDS]
                loads.sent(dest, len(block))
                runs.setdefault(dest, []).append([s, first + start, block])
            add_range(counts, s, first, n)
        else:
            table = route.period or route.table
            tn = len(table)
            block = max(1, n // tn) if n >= tn else 1
            for start in range(0, n, block):
                dest = table[(first + start) // block % tn]
                runs.setdefault(dest, []).append([s, first + start, part[start:start + block]])
            add_range(counts, s, first, n)
    return d


def dispatch(queue: deque, spec: DagSpec, routes: Sequence[Route], room: int,
             loads: Loads | None = None) -> Dispatch | None:
    """One step of the planner's scheduling engine: None when the window is full or the queue empty."""
    if room <= 0 or not queue:
        return None
    first, part = take(queue, room)
    return route_records(spec, routes, first, part, loads)


def _route_segments(routes: Sequence[Route], first: int, part: Segments, runs: dict, counts: dict,
                    loads: Loads | None) -> None:
    """A pushed chunk's segments to stateless sources, as `route_records` cuts a list into runs: each
    segment is one run, its bytes as the client packed them, with `loads` to the least loaded worker, else
    to the table slot of the block its first record falls in (the first block's slot moves on with each
    dispatch, by `first // n`, so a dispatch of fewer segments than the table has slots does not always
    start at the same one)."""
    n = len(part)
    for route in routes:
        s = route.succ
        start = 0
        if loads is not None:
            sigma = route_sigma(route)
            pick, sent = loads.pick, loads.sent
            for seg, k in zip(part.parts, part.counts, strict=True):
                dest = pick(sigma)
                sent(dest, k)
                runs.setdefault(dest, []).append([s, first + start, seg])
                start += k
        else:
            table = route.period or route.table
            tn = len(table)
            block = max(1, n // tn)
            at = first // max(1, n)
            for seg, k in zip(part.parts, part.counts, strict=True):
                runs.setdefault(table[(at + start // block) % tn], []).append([s, first + start, seg])
                start += k
        add_range(counts, s, first, n)


# ----------------------------------------------------------------- recovery of a dead worker
@dataclass(slots=True)
class Recovery:
    """What to do when worker `dead` of a job died: migrate to `placement` (the survivors take its
    share), suspect every record below `fence`, and record `decision`."""

    placement: Placement
    fence: int
    lost_groups: int
    reason: str
    decision: dict


def survivor_placement(spec: DagSpec, old: Placement, alive: Sequence[str],
                       key_weights: Mapping[str, list[float]] | None = None) -> Placement:
    """`old` without the workers not in `alive`, at the next epoch: each operator keeps its shares on the
    survivors (scaled to sum to 1; one with none left goes whole to the first of `pool_order`), and a
    stateful one's key groups move off the dead with minimal moves (by `key_weights` where measured)."""
    if not alive:
        raise ValueError("no survivors to re-place on")
    key_weights = key_weights or {}
    ops = {}
    for o in spec.operators:
        p = old.operators[o.name]
        shares = {w: s for w, s in p.shares.items() if w in alive}
        if not shares:
            shares = {pool_order(old, list(alive))[0]: 1.0}
        total = sum(shares.values())
        shares = {w: v / total for w, v in shares.items()}
        kg = (key_groups_for_shares(shares, NUM_KEY_GROUPS, p.key_groups, key_weights.get(o.name))
              if o.stateful else None)
        ops[o.name] = OperatorPlacement(shares, {w: p.instances.get(w, 1) for w in shares}, kg)
    return Placement(ops, old.epoch + 1, old.workers)


def dispatch_fence(queue: deque, next_chunk: int) -> int:
    """The first record id not dispatched yet: the queue head's next record, or the next chunk's first."""
    return queue[0][0] + queue[0][2] if queue else next_chunk << CHUNK_BITS


def plan_recovery(spec: DagSpec, old: Placement, settled: Placement | None, dead: str, alive: Sequence[str],
                  queue: deque, next_chunk: int, key_weights: Mapping[str, list[float]] | None = None,
                  t: float = 0.0) -> Recovery:
    """Recovery of a job from the death of worker `dead` (`alive`: its workers still serving it, not
    empty; `settled`: the placement of the last migration every worker completed; `t`: seconds since the
    job started). Records dispatched until now may have had weight on the dead worker: they leave the
    in-flight window (which would otherwise stay full of records that never complete) and are counted
    as lost once no survivor holds anything of them; the migration switches the routes in the same step,
    so every record from the fence on goes to survivors only."""
    settled = settled or old
    lost_groups = sum(1 for o in spec.operators if o.stateful for g in settled.operators[o.name].key_groups
                      if g == dead)
    reason = f"worker {dead} died: its {lost_groups} key groups restart empty (their state is lost)"
    decision = {"t": round(t, 3), "trigger": f"worker {dead} died", "reason": reason, "change": True}
    return Recovery(survivor_placement(spec, old, alive, key_weights), dispatch_fence(queue, next_chunk),
                    lost_groups, reason, decision)


# ----------------------------------------------------------------- the lost-record sweep
def sweep_step(sweep: tuple[int, int] | None, suspects: int, migrating: bool,
               clean: bool) -> tuple[tuple[int, int] | None, bool]:
    """One check for records lost with a dead worker: returns (the sweep's new state, lose the suspects
    now). A check is clean when no survivor holds anything of a suspect record; after two clean checks a
    tick apart with no suspect completing in between (a request on the wire between survivors shows up
    in one of them), the suspects still open are lost. `sweep`: (suspects at the last clean check,
    clean checks in a row), None after anything else."""
    if not suspects or migrating or not clean:
        return None, False
    if sweep is None or sweep[0] != suspects:
        return (suspects, 1), False
    return None, True


def lost_error(n: int, lost_workers: set[str] | Sequence[str]) -> dict:
    """The job's error entry for `n` records given up on with the dead workers."""
    dead = ",".join(sorted(lost_workers))
    return {"worker": dead, "operator": "", "value": "",
            "error": f"{n} records lost with dead worker(s) {dead}: they had requests or "
                     f"state there; their key groups restarted empty"}


# ----------------------------------------------------------------- idle, and serving again
# A worker that registers while its old process's recovery runs is refused and registers again within 2 s
# (`Worker._register_loop`): for this long after a refusal its rejoin is still expected.
REJOIN_WAIT = 5.0


@dataclass(frozen=True, slots=True)
class JobCondition:
    """What the planner knows of a job at one moment besides its placement: what `busy` and `unsettled`
    decide on (`Planner._condition` fills it)."""

    outstanding: int = 0  # records admitted and neither complete nor given up on (the queued ones too)
    queued: int = 0  # of those, still in the planner's queue
    suspected: tuple[str, ...] = ()  # serving workers whose connection dropped, silent since: maybe dead
    recovering: tuple[str, ...] = ()  # workers declared dead whose job recovery has not finished
    rolling_back: bool = False  # a rollback to a checkpoint is under way
    orphaned: bool = False  # the job lost every worker: it waits for one to recover on
    replaying: int = 0  # records complete before the last rollback and not complete again yet
    rejoining: tuple[str, ...] = ()  # restarted workers the job is not deployed on again yet
    migrating: bool = False
    reading: int = 0  # source partitions not read to their end (a stream's: all of them, until `stop()`)


def suspected(serving: Sequence[str], dropped: Mapping[str, float], heard: Mapping[str, float]) -> tuple[str, ...]:
    """The serving workers whose data connection dropped (`dropped`: when it last did) and who sent
    nothing since (`heard`: when each was last heard from): a killed process, not declared dead yet. A
    restarted process on the same ports soon reconnects, so the drop itself, not the connection being
    down now, is what counts until the worker is heard from again or declared dead."""
    return tuple(w for w in serving if w in dropped and dropped[w] >= heard.get(w, float("-inf")))


def expected_rejoins(workers: Sequence[str], refused: Mapping[str, float], now: float) -> tuple[str, ...]:
    """The job's workers a new process of which was refused registration (`refused`: when) while the old
    process's recovery ran, recently enough that it is still expected to register again."""
    return tuple(w for w in workers if w in refused and now - refused[w] < REJOIN_WAIT)


def unsettled(c: JobCondition) -> str | None:
    """Why the job's workers cannot answer for its state now, or None when they can: a worker that may
    have died, a recovery not over, no worker left, or a rollback's replay that has not caught up (state
    read then would lack records whose effect was in it before)."""
    if c.orphaned:
        return "lost every worker and waits for one to recover on"
    if c.recovering:
        return f"is recovering from the death of worker(s) {', '.join(sorted(c.recovering))}"
    if c.rolling_back:
        return "is rolling back to its last complete checkpoint"
    if c.suspected:
        return f"may have lost worker(s) {', '.join(sorted(c.suspected))}: the connection dropped"
    if c.replaying:
        return f"is replaying {c.replaying} records a rollback reopened"
    return None


def busy(c: JobCondition) -> str | None:
    """Why `wait_idle` must not return yet, or None when the job is idle: no record outstanding, and no
    recovery, rollback, rejoin or migration under way (after one, the job's state and workers are those
    it will keep while no more input comes)."""
    if c.outstanding:
        return f"still has {c.outstanding} records in flight ({c.queued} queued at the planner)"
    if c.reading:
        return f"is still reading {c.reading} source partition(s)"
    why = unsettled(c)
    if why is not None:
        return why
    if c.rejoining:
        return f"is deploying on restarted worker(s) {', '.join(sorted(c.rejoining))}"
    if c.migrating:
        return "is migrating"
    return None


# ----------------------------------------------------------------- job statistics
class JobView(Protocol):
    """What `job_stats` reads of a job (the planner's `PlannerJob`)."""

    id: int
    spec: DagSpec
    tracker: Tracker
    workers: list[str]
    placement: Placement
    queued: int
    queued_bytes: int
    counters: dict
    last: dict
    errors: Any
    autoscale: bool
    estimate: dict
    decisions: Any
    migrations: list
    lost_workers: set
    series: Any
    window: int
    batch: int
    inflight: int


def worker_row(w: WorkerInfo | None, js: dict) -> dict:
    """One worker's part of a job's statistics, from its last heartbeat (`js`: its sample of the job)."""
    return {"alive": bool(w and w.alive), "queue": js.get("queue", 0),
            "r_local": js.get("r_local", 0.0), "r_remote": js.get("r_remote", 0.0),
            "delta": w.sample.get("delta", 0) if w else 0, "exec_us": js.get("exec_us", 0.0),
            "cpu_us": w.sample.get("cpu_us") if w else None,
            "queue_delay": js.get("queue_delay", 0.0), "operators": js.get("operators", {}),
            "metrics": w.metrics if w else None}


def job_stats(job: JobView, workers: Mapping[str, WorkerInfo], workers_alive: int,
              counters: Mapping[str, dict] | None = None) -> dict:
    """Throughput, input rate, latency, and the Table 2 metrics of every worker, for one job.

    With `counters` (worker -> its exact cumulative counters), processed counts, errors and mean
    execution times come from those instead of the last heartbeats."""
    per_worker = {}
    operators: dict[str, dict] = {o.name: {"rate": 0.0, "tau_us": 0.0, "processed": 0, "errors": 0,
                                           "queue": 0} for o in job.spec.operators}
    edges: dict[tuple[str, str], float] = {}
    failed = 0
    for wid in job.workers:
        w = workers.get(wid)
        js = (w.sample.get("jobs", {}).get(job.id) if w else None) or {}
        per_worker[wid] = worker_row(w, js)
        failed += js.get("failed", 0)
        for name, o in js.get("operators", {}).items():
            agg = operators[name]
            busy = agg["rate"] * agg["tau_us"] + o["rate"] * o["tau_us"]
            agg["rate"] += o["rate"]
            agg["tau_us"] = busy / agg["rate"] if agg["rate"] else 0.0
            agg["processed"] += o["processed"]
            agg["errors"] += o["errors"]
            agg["queue"] += o["queue"]
        for e in js.get("edges", []):
            edges[(e["src"], e["dst"])] = edges.get((e["src"], e["dst"]), 0.0) + e["rate"]
    if counters is not None:
        failed = 0
        for o in operators.values():
            o["processed"], o["errors"], o["queue"], o["exec_s"] = 0, 0, 0, 0.0
        for wid, c in counters.items():
            failed += c["failed"]
            per_worker[wid]["counters"] = c
            for name, o in c["operators"].items():
                agg = operators[name]
                agg["processed"] += o["processed"]
                agg["errors"] += o["errors"]
                agg["queue"] += o["queue"]
                agg["exec_s"] += o["exec_s"]
        for o in operators.values():
            o["tau_us_mean"] = o["exec_s"] / o["processed"] * 1e6 if o["processed"] else 0.0
    t = job.tracker
    return {
        "job": job.id, "name": job.spec.name,
        "input_rate": job.last.get("input_rate", 0.0), "throughput": job.last.get("throughput", 0.0),
        "latency": {"last": {k: job.last.get(k) for k in ("p50", "p95", "p99")}, **t.cumulative.summary()},
        "pushed": job.counters["pushed"], "completed": t.completed, "outstanding": t.outstanding,
        "queued": job.queued, "queued_bytes": job.queued_bytes, "lost": t.lost, "suspected_lost": t.suspects,
        "in_flight": {"records": job.inflight, "window": job.window, "dispatch_batch": job.batch},
        "failed": failed + job.counters["source_errors"],
        "errors": list(job.errors), "workers": per_worker, "operators": operators,
        "edges": [{"src": s, "dst": d, "rate": r} for (s, d), r in edges.items()],
        "placement": job.placement.to_wire(), "workers_active": len(job.placement.active_workers()),
        "active_workers": job.placement.active_workers(), "epoch": job.placement.epoch,
        "autoscale": job.autoscale, "model": dict(job.estimate), "decisions": list(job.decisions),
        "migrations": list(job.migrations), "lost_workers": sorted(job.lost_workers),
        "workers_alive": workers_alive, "series": list(job.series)[-120:],
    }


# ----------------------------------------------------------------- migration records
def migration_record(old: Placement, new: Placement, reason: str, t: float, duration: float,
                     participants: Sequence[str], replies: Sequence[object], moved_groups: int,
                     dead: Sequence[str]) -> dict:
    """What one migration to `new` did: `replies[i]` is participant i's reply (a dict) or what went wrong
    (anything else: an exception, a timeout); `t`: seconds since the job started."""
    ok = [r for r in replies if isinstance(r, dict)]
    failed = {w: str(r) for w, r in zip(participants, replies, strict=True) if not isinstance(r, dict)}
    return {"epoch": new.epoch, "reason": reason, "t": round(t, 3),
            "from_workers": len(old.active_workers()), "to_workers": len(new.active_workers()),
            "active": new.active_workers(), "duration_s": duration,
            "max_pause_s": max((r["pause"] for r in ok), default=0.0),
            "max_hold_s": max((r["hold"] for r in ok), default=0.0),
            "max_group_hold_s": max((r["group_hold"] for r in ok), default=0.0),
            "max_pause_cpu_s": max((r.get("pause_cpu_ms", 0.0) for r in ok), default=0.0) / 1e3,
            "pauses": {r["worker"]: r["pause"] for r in ok},
            "phases_ms": {r["worker"]: {k: round(v, 2) for k, v in r.items() if k.endswith("_ms")} for r in ok},
            "bytes": sum(r["bytes"] for r in ok), "objects": sum(r["objects"] for r in ok),
            "rows": sum(r["rows"] for r in ok), "key_groups_moved": moved_groups,
            "key_groups_packed": sum(r.get("packed_groups", 0) for r in ok),
            "dead": list(dead), "failed": failed}
