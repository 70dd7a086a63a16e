"""The planner process: worker registry, jobs, the incoming request queue and its scheduling engine.

One ROUTER socket serves workers (register, heartbeat, done, replies) and clients (submit, push, ...);
a PUSH per worker carries input records to the workers holding the DAG's source operators. The planner
never executes an operator and never relays chained requests between workers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from zmq.utils.monitor import parse_monitor_message

from clasp.core import protocol, scheduler
from clasp.core.control import (
    ControlConfig,
    Controller,
    key_weights,
    observation,
    pool_order,
    to_runtime_placement,
)
from clasp.core.credit import (
    DEFAULT_MAX_QUEUED_BYTES,
    ByteQueue,
    QueueBound,
    charge,
    drain_rate,
    share,
)
from clasp.core.dag import DagError, DagSpec
from clasp.core.limits import LimitError, check_client_pending, check_dag, check_message
from clasp.core.migration import PLANNER, plan_migration
from clasp.core.partitions import readers_follow
from clasp.core.placement import NoPlacementError
from clasp.core.policies import POLICIES
from clasp.core.protocol import ProtocolError
from clasp.core.routing import (
    NUM_KEY_GROUPS,
    Placement,
    PlacementError,
    build_placement,
    route_to,
    spread_placement,
)
from clasp.core.scheduler import WorkerInfo
from clasp.core.tracking import CHUNK_BITS, LatencyHistogram, Tracker
from clasp.runtime.config import STATE_MODES, PlannerConfig
from clasp.runtime.dashboard import Dashboard, planner_view
from clasp.runtime.elastic import ElasticPool, PoolError
from clasp.runtime.net import DirectSend, advertised, bind, drained, start_metrics_server, zero_copy
from clasp.runtime.planner_recovery import CheckpointState, PlannerRecoveryMixin
from clasp.runtime.planner_sinks import PlannerSinkMixin
from clasp.runtime.planner_sources import PlannerSourcesMixin, SourceState, list_partitions, owners_under
from clasp.runtime.planner_time import PlannerTimeMixin
from clasp.runtime.providers import Provider
from clasp.runtime.security import Security
from clasp.runtime.state_server import StateServer
from clasp.runtime.state_store import FileStore, check_state_dir
from clasp.runtime.tasks import ProcessTasks, internal_error

log = logging.getLogger("clasp.planner")

PlacementFn = Callable[[DagSpec, list[str], int], Placement]
CLIENT_IDLE = 2.0  # s without a push after which a client no longer shares a job's credit
ANSWER_TIMEOUT = 50.0  # s `state` and `collected` wait for a recovering job when the request names none
SETTLE_POLL = 0.05  # s between looks at a recovering job by a request waiting for it


class RequestError(Exception):
    """A client request that cannot be served; the message goes back to the client."""


class NoAnswer(RequestError):
    """A worker did not answer a request in time."""


class WorkerDied(NoAnswer):
    """A worker was declared dead before it answered: once the job recovered, the question may be asked again."""


# Errors whose text is meant for the client (a bad request); any other exception in a handler is a bug:
# logged with its traceback, and the client gets an error id (`clasp.runtime.tasks.internal_error`).
CLIENT_ERRORS = (RequestError, DagError, PlacementError, NoPlacementError, ProtocolError, LimitError, TimeoutError,
                 PoolError)


@dataclass
class PlannerJob:
    """A submitted job as the planner holds it."""

    id: int
    spec: DagSpec
    placement: Placement
    tracker: Tracker
    workers: list[str]
    queue: deque = field(default_factory=deque)  # [base_rid, records, offset] not yet dispatched (Q_p)
    queued: int = 0
    queue_bytes: ByteQueue = field(default_factory=ByteQueue)  # the bytes of Q_p, chunk by chunk (clasp.core.credit)
    counters: dict = field(default_factory=lambda: {"pushed": 0, "dispatched": 0, "source_errors": 0})
    series: deque = field(default_factory=lambda: deque(maxlen=3600))
    last: dict = field(default_factory=dict)
    waiters: list = field(default_factory=list)  # [ident, req, deadline]
    deferred_acks: deque = field(default_factory=deque)  # (client, req, records, last chunk) not acknowledged yet
    limit: int = DEFAULT_MAX_QUEUED_BYTES  # the bytes Q_p may hold now (QueueBound.limit of the drain rate)
    drain: float | None = None  # bytes/s the dispatch drains Q_p at while it holds a backlog (credit.drain_rate)
    drained: int = 0  # bytes dispatched since the last tick
    backlog: bool = False  # Q_p held records throughout the tick so far
    clients: dict = field(default_factory=dict)  # client -> when it last pushed: they share the credit
    cancelled: bool = False
    routes: list = field(default_factory=list)
    window: int = scheduler.WINDOW_MIN  # records in flight and per dispatch (`scheduler.dispatch_limits`)
    batch: int = scheduler.BATCH_MIN
    created: float = field(default_factory=time.time)
    errors: deque = field(default_factory=lambda: deque(maxlen=50))
    autoscale: bool = False
    controller: Controller | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    migrating: bool = False
    migrations: list = field(default_factory=list)
    decisions: deque = field(default_factory=lambda: deque(maxlen=200))
    estimate: dict = field(default_factory=dict)
    key_weights: dict = field(default_factory=dict)  # stateful operator -> requests/s per key group (smoothed)
    lost_workers: set = field(default_factory=set)  # every worker that died while serving the job
    retired: set = field(default_factory=set)  # of those, the ones not serving it again (no redeploy yet)
    recovering: set = field(default_factory=set)  # declared dead while serving it, the recovery not over
    rejoining: set = field(default_factory=set)  # restarted workers being deployed the job again
    confirming: bool = False  # asking every worker whether it is alive before wait_idle returns
    sweep: tuple | None = None  # (suspects, clean checks in a row) while looking for records lost with a worker
    settled: Placement | None = None  # the placement of the last migration every worker completed
    state: str = "local"  # "remote": stateful operators keep their state in the planner's state server
    ckpt: CheckpointState | None = None  # checkpoints and the input log (None: checkpoints off)
    spec_wire: dict = field(default_factory=dict)  # the DAG as submitted (DagSpec.pack())
    policy: str = "clasp"
    src: SourceState | None = None  # declared sources: partitions, owners, positions (None: push only)

    @property
    def queued_bytes(self) -> int:
        return self.queue_bytes.total

    @property
    def inflight(self) -> int:
        """Records in the window: dispatched, not complete, and not suspected lost with a dead worker."""
        t = self.tracker
        return self.counters["dispatched"] - (t.completed - t.read_done) - t.lost - t.suspects


def _key_weights(spec: DagSpec, raw: dict) -> dict[str, list[float]]:
    """`submit`'s optional key-group weights: stateful operator -> NUM_KEY_GROUPS non-negative numbers."""
    stateful = {o.name for o in spec.operators if o.stateful}
    out = {}
    for op, row in raw.items():
        if op not in stateful:
            raise RequestError(f"key_weights names {op!r}, which is not a stateful operator of the DAG")
        if (not isinstance(row, list) or len(row) != NUM_KEY_GROUPS
                or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                           for v in row)):
            raise RequestError(f"key_weights[{op!r}] must be {NUM_KEY_GROUPS} non-negative numbers")
        out[op] = [float(v) for v in row]
    return out


class Planner(PlannerRecoveryMixin, PlannerSinkMixin, PlannerSourcesMixin, PlannerTimeMixin):
    """The planner. `await Planner(...).serve()` runs until cancelled."""

    def __init__(self, config: PlannerConfig | None = None, *, security: Security | None = None,
                 provider: Provider | None = None, placement_fn: PlacementFn = spread_placement,
                 control: ControlConfig | None = None):
        """`config`: every setting `clasp planner` has a flag for; beside it what no flag carries: the CURVE
        keys, the elastic pool's provider, the initial placement, and the control loop's settings (default:
        `ControlConfig` with `config.warmup`)."""
        config = config or PlannerConfig()
        self.config = config
        self.host, self.port, self.metrics_port = config.host, config.port, config.metrics_port
        self.metrics_host = config.metrics_host or config.host
        self.security = security or Security()
        self.client_tasks: dict[bytes, int] = {}  # slow requests being served, per client
        self.advertise = advertised(config.host, config.advertise)
        self.heartbeat = config.heartbeat
        self.dead_after = config.dead_after
        # A worker whose data connection dropped (a process that died: the kernel closes its sockets) and
        # that sent no heartbeat for this long is dead, without waiting out `dead_after` (which covers a
        # frozen process or a silent network, whose connections stay up).
        self.dead_after_disconnect = config.dead_after_disconnect
        self.disconnected: dict[str, float] = {}  # worker -> when the data connection to it dropped
        self.dropped: dict[str, float] = {}  # worker -> when the data connection to it last dropped
        self.refused: dict[str, float] = {}  # worker -> when a new process of it was told to register later
        self.max_inflight = config.max_inflight  # None: per worker of the job (`scheduler.dispatch_limits`)
        self.max_queue = config.max_queued
        # per job, on Q_p: records, bytes, and seconds of draining
        self.bound = QueueBound(config.max_queued, config.max_queued_bytes, config.max_queue_delay)
        self.dispatch_batch = config.dispatch_batch
        self.p_max = config.p_max
        self.placement_fn = placement_fn
        self.rpc_timeout = config.rpc_timeout
        self.autoscale = config.autoscale
        self.policy = config.policy
        self.migration_timeout = config.migration_timeout
        self.control = control or ControlConfig(warmup_requests=config.warmup)
        self.state, self.state_port = config.state, config.state_port
        self.checkpoint_interval = config.checkpoint_interval
        self.state_dir = config.state_dir
        self.store = (FileStore(check_state_dir(config.state_dir))
                      if config.state_dir and config.checkpoint_interval > 0 else None)
        self.input_log_records = config.input_log_records
        self.recoveries = 0
        self.records_replayed = 0
        self.checkpoint_hist = LatencyHistogram()
        self.rpc_meta: dict[int, tuple[str, int | None, str]] = {}
        self.rescales = 0
        self.records_lost = 0  # cumulative over every job, for clasp_records_lost_total
        self.migration_hist = {"planner": LatencyHistogram(), "worker": LatencyHistogram()}
        self.id = f"p-{uuid.uuid4().hex[:8]}"
        # Not under SCHED_BATCH (`net.batch_io_threads`, the workers' choice): with batch I/O threads the
        # planner's side of a refused plaintext handshake reached the client as a bare disconnect, and the
        # client could no longer say "the planner requires CURVE keys" (tests/cluster/test_security.py).
        self.ctx = zmq.asyncio.Context()
        self.workers: dict[str, WorkerInfo] = {}
        self.pushers: dict[str, DirectSend] = {}
        self.jobs: dict[int, PlannerJob] = {}
        self.deploying: dict[int, PlannerJob] = {}  # jobs submitted and not deployed everywhere yet
        self._job_ids = itertools.count(1)
        self._req_ids = itertools.count(1)
        self.pending_rpcs: dict[int, asyncio.Future] = {}
        self.bad_messages: dict[str, int] = {}
        self.latency = LatencyHistogram()
        self.last_rates = {"input_rate": 0.0, "throughput": 0.0}
        self.dispatch_wake = asyncio.Event()
        self.tasks = ProcessTasks(log)  # every task of this process; cancelled together when serve() ends
        self.elastic = ElasticPool(self, provider)  # join, drain, the provider (clasp/runtime/elastic.py)
        self.started = time.monotonic()

    # ----------------------------------------------------------------- lifecycle
    async def serve(self) -> None:
        self.security.start_zap(self.ctx)
        self.router = self.security.server(self.ctx.socket(zmq.ROUTER), "planner")
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.router.setsockopt(zmq.RCVHWM, self.security.limits.router_rcvhwm)
        self.port = bind(self.router, self.host, self.port)
        self.endpoint = f"tcp://{self.advertise}:{self.port}"
        registry = CollectorRegistry()
        registry.register(_PlannerCollector(self))
        registry.register(self.security.collector())
        # The dashboard (docs/RUNTIME.md): its views are built on this loop, at most once a second.
        self.dashboard = Dashboard(asyncio.get_running_loop(), lambda key: planner_view(self, key))
        self.metrics_url = start_metrics_server(registry, self.metrics_host, self.metrics_port,
                                                self.advertise if self.metrics_host == self.host
                                                else advertised(self.metrics_host, None), self.dashboard.app)
        self.dashboard_url = self.metrics_url.removesuffix("metrics")
        self.state_server = StateServer(self.ctx, self._remote_state_check, self._bad, self.security)
        self.state_server.bind(self.host, self.state_port, self.advertise)
        print(f"clasp planner {self.id} endpoint={self.endpoint} metrics={self.metrics_url} "
              f"dashboard={self.dashboard_url} state={self.state_server.endpoint} "
              f"curve={'on' if self.security.enabled else 'off'} "
              f"state_dir={self.store.root if self.store is not None else 'none'}", flush=True)
        try:
            loops = [self._recv_loop(), self._dispatch_loop(), self._tick_loop(), self.state_server.serve(),
                     self.security.run(), self._liveness_loop()]
            self._load_stored_jobs()
            if self.store is not None:
                loops.append(self._checkpoint_loop())
            await self.tasks.run(*loops)
        finally:
            self.ctx.destroy(linger=200)

    def _load_stored_jobs(self) -> None:
        """A planner restarted on a state directory takes up the jobs it finds there (docs/RECOVERY.md)."""
        top = 0
        for stored in self._stored_jobs():
            rec = stored["rec"]
            try:
                spec = DagSpec.unpack(rec["dag"])
                placement = Placement.from_wire(rec["placement"], spec)
            except Exception as e:
                log.error("job %s in %s cannot be taken up: %s", rec.get("id"), self.store.root, e)
                continue
            workers = [str(w) for w in rec["workers"]]
            job = PlannerJob(int(rec["id"]), spec, placement, Tracker(), workers, autoscale=bool(rec["autoscale"]),
                             settled=placement, state=rec["state"], key_weights=rec["key_weights"] or {},
                             spec_wire=rec["dag"], policy=rec["policy"], created=float(rec["created"]))
            job.limit = self.bound.limit(None)
            job.controller = self._controller(spec, job.policy, len(workers))
            job.ckpt = self._new_ckpt_state(job.id)
            self._revive(job, stored)
            self._set_routes(job)
            self.jobs[job.id] = job
            top = max(top, job.id)
            log.warning("job %d (%s) taken up from %s: %d complete checkpoints, %d records to replay", job.id,
                        spec.name, self.store.root, len(stored["complete"]), job.tracker.outstanding)
            self._background(self._resume(job), f"resuming job {job.id}")
        if top:
            self._job_ids = itertools.count(top + 1)

    def _remote_state_check(self, job_id: int, op: str) -> str | None:
        job = self.jobs.get(job_id)
        if job is None or job.state != "remote":
            return f"no job {job_id} with remote state"
        if not any(o.name == op and o.stateful for o in job.spec.operators):
            return f"job {job_id} has no stateful operator {op!r}"
        return None

    def live_workers(self) -> list[str]:
        """Alive workers in registration order: index i of a placement is the i-th of these."""
        return [w.id for w in sorted(self.workers.values(), key=lambda w: w.registered) if w.alive]

    # ----------------------------------------------------------------- receiving
    def _bad(self, reason: str) -> None:
        self.bad_messages[reason] = self.bad_messages.get(reason, 0) + 1

    async def _send(self, ident: bytes, frame: bytes) -> None:
        try:
            await self.router.send_multipart([ident, frame], copy=False)
        except zmq.ZMQError as e:  # EHOSTUNREACH: the peer is gone
            log.debug("could not send to %r: %s", ident, e)

    async def _recv_loop(self) -> None:
        handlers = {
            "register": self._on_register, "heartbeat": self._on_heartbeat, "done": self._on_done,
            "reply": self._on_reply, "error": self._on_error_msg, "submit": self._on_submit, "push": self._on_push,
            "wait_idle": self._on_wait_idle, "state": self._on_state, "collected": self._on_collected,
            "stats": self._on_stats, "cancel": self._on_cancel, "jobs": self._on_jobs, "workers": self._on_workers,
            "scale": self._on_scale, "place": self._on_place, "autoscale": self._on_autoscale,
            "drain": self.elastic.on_drain, "leave": self.elastic.on_leave, "pool": self.elastic.on_pool,
            "lease": self._on_lease, "seal": self._on_seal, "read_end": self._on_read_end, "stop": self._on_stop,
            "wm_mark": self._on_wm_mark, "wm_idle": self._on_wm_idle, "wm_fired": self._on_wm_fired,
            "wm_out": self._on_wm_out,
        }
        recv, raw = self.router.recv_multipart, zmq.Socket.shadow(self.router.underlying)
        while True:
            self._on_frames(handlers, await recv())
            for frames in drained(raw, multipart=True):
                self._on_frames(handlers, frames)

    def _on_frames(self, handlers: dict, frames: list) -> None:
        """One message on the router: checked, then handled (a slow handler on its own task)."""
        ident = frames[0]
        try:
            if len(frames) != 2:
                raise ProtocolError("bad_envelope", f"{len(frames) - 1} payload frames")
            mtype, body = protocol.decode_message(frames[1])  # a typed message (or a done list), checked
            handler = handlers.get(mtype)
            if handler is None:
                raise ProtocolError("unexpected_type", f"{mtype} is not for the planner")
        except ProtocolError as e:
            self._bad(e.reason)
            log.warning("dropped a bad message from %r: %s", ident[:16], e)
            self._post(ident, protocol.error(e.reason, e.detail))
            return
        try:
            if mtype == "submit":
                check_dag(len(frames[1]), body.dag.get("functions"), self.security.limits)
            tasks = self.client_tasks.get(ident, 0)
            if tasks:
                check_client_pending(tasks, self.security.limits)
            result = self._on_push(ident, body, frames[1]) if mtype == "push" else handler(ident, body)
            if asyncio.iscoroutine(result):
                # Slow handlers (they wait on workers) run on their own so the loop keeps receiving.
                self.client_tasks[ident] = tasks + 1
                self._background(self._finish(ident, mtype, body, result), f"handling {mtype}")
        except Exception as e:  # a failing handler answers its request; it never stops the planner
            if isinstance(e, LimitError):
                self.security.rejected(e.limit)
                log.warning("refused %s from %r: %s", mtype, ident[:16], e)
            self._reply_error(ident, getattr(body, "req", 0), e, mtype)

    def _background(self, coro, what: str) -> None:
        """Run a coroutine on its own, owned by the planner's task group; a failure is logged."""
        self.tasks.spawn(coro, what)

    def _post(self, ident: bytes, frame: bytes) -> None:
        """Send without waiting (from a handler that does not await)."""
        self.tasks.spawn(self._send(ident, frame), "a send")

    async def _finish(self, ident, mtype: str, body, coro) -> None:
        try:
            await coro
        except Exception as e:
            self._reply_error(ident, getattr(body, "req", 0), e, mtype)
        finally:
            n = self.client_tasks.pop(ident, 1) - 1
            if n > 0:
                self.client_tasks[ident] = n

    def _reply_error(self, ident, req: int, e: BaseException, mtype: str = "a request") -> None:
        """Answer request `req` that failed: with the error's text when it is meant for the client (a bad
        request), else (a bug here) with an error id, the traceback in the planner's log under it."""
        if isinstance(e, RequestError):
            text = str(e)
        elif isinstance(e, CLIENT_ERRORS):
            text = f"{type(e).__name__}: {e}"
        else:
            text = internal_error(log, f"handling {mtype}", e, "the planner log")
        self._post(ident, protocol.reply_error(req, text))

    def _reply(self, ident, req: int, result) -> None:
        frame = protocol.reply(req, result)
        if len(frame) > self.security.limits.max_message:  # the peer's socket would drop the connection
            try:
                check_message(len(frame), "the answer")
            except LimitError as e:
                self.security.rejected(e.limit)
                frame = protocol.reply_error(req, str(e))
        self._post(ident, frame)

    # ----------------------------------------------------------------- workers
    def _on_register(self, ident: bytes, msg: protocol.Register) -> None:
        wid = msg.id
        if ident != wid.encode():
            raise RequestError("a worker registers from a socket whose identity is its id")
        now = time.monotonic()
        prev = self.workers.get(wid)
        if self.elastic.refuses(wid, msg.pid):
            return  # drained: this process is exiting
        restarted = prev is not None and ((prev.pid, prev.data) != (msg.pid, msg.data) or not prev.alive)
        if restarted and not self._old_incarnation_gone(prev, msg.pid):
            self.refused[wid] = now  # no welcome yet: the worker registers again in 2 s
            return
        self.refused.pop(wid, None)
        info = WorkerInfo(wid, msg.host, msg.data, msg.state, msg.metrics, msg.p_max,
                          msg.pid, prev.registered if prev else now, now)
        self.workers[wid] = info
        old = self.pushers.get(wid)
        if old is not None and prev is not None and prev.data != info.data:
            old.close(0)  # a restarted worker on another port: what was queued for the old one is lost anyway
            del self.pushers[wid]
        if wid not in self.pushers:
            sock = zero_copy(self.security.peer(self.ctx.socket(zmq.PUSH)))
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(info.data)
            self.pushers[wid] = pusher = DirectSend(sock)
            self._background(self._watch_connection(wid, pusher), f"watching the connection to {wid}")
        log.info("worker %s registered (data %s, metrics %s, pid %d)", wid, info.data, info.metrics, info.pid)
        self._post(ident, protocol.encode("welcome", {"planner": self.id, "heartbeat": self.heartbeat}))
        if restarted:
            for job in list(self.jobs.values()):
                if wid in job.workers:
                    job.rejoining.add(wid)
                    self._background(self._redeploy(job, wid), f"deploying job {job.id} on restarted worker {wid}")
        elif prev is None:
            self.elastic.joined(wid)  # a newcomer joins the running jobs' pools at once

    def _old_incarnation_gone(self, prev: WorkerInfo, pid: int) -> bool:
        """A worker registers with the id of one known here, from another process: the old process died
        (a supervisor restarted it). The old one is declared dead first, and its jobs recovered as when
        heartbeats stop (its key groups restart empty); True once that is over and the new one may join."""
        if prev.alive:
            prev.alive = False
            log.warning("worker %s registers from a new process (pid %d, was %d): the old one died", prev.id, pid,
                        prev.pid)
            self._worker_died(prev.id)
            return False
        # Recovery (or a migration it waits behind) holds the job's lock; with checkpoints, a recovery is
        # over once the job retired the old process (checkpoints hold the lock too, every interval).
        return not any(prev.id in job.workers and (job.lock.locked() if job.ckpt is None
                                                   else prev.id in job.ckpt.dying or prev.id not in job.retired)
                       for job in self.jobs.values())

    async def _redeploy(self, job: PlannerJob, wid: str) -> None:
        """Deploy `job` on a restarted worker of its pool, holding nothing (its share was re-placed when the old
        process died), so that it answers for the job and can take part in the job's next placement."""
        try:
            await self._deploy_again(job, wid)
        finally:
            job.rejoining.discard(wid)

    async def _deploy_again(self, job: PlannerJob, wid: str) -> None:
        async with job.lock:
            if self.jobs.get(job.id) is not job or job.cancelled:
                return
            if job.ckpt is not None and job.ckpt.orphaned is not None:
                job.retired.discard(wid)
                await self._resume_orphan(job)  # it had no worker left: it recovers onto this one
                return
            peers = {w: self.workers[w].data for w in job.workers if w in self.workers}
            await self.rpc(wid, "deploy", {"job": job.id, "dag": job.spec.pack(), "placement": job.placement.to_wire(),
                                           "peers": peers, "state": job.state,
                                           "state_server": self.state_server.endpoint,
                                           "floor": job.placement.epoch if job.ckpt is not None else 0,
                                           "run": self._sink_run(job)})
            job.retired.discard(wid)  # a new process with nothing of the job: it may be placed on again
            log.info("job %d deployed on restarted worker %s (epoch %d, holding nothing)", job.id, wid,
                     job.placement.epoch)

    def _on_heartbeat(self, ident: bytes, msg: protocol.Heartbeat) -> None:
        w = self.workers.get(msg.id)
        if w is None or ident != w.id.encode():
            self._post(ident, protocol.error("unknown_worker", "register first"))
            return
        if not w.alive:
            # Declared dead: its jobs were recovered without it. It is told so, and registers again as new.
            log.info("worker %s is back after it was declared dead: it re-registers as a new worker", w.id)
            self._post(ident, protocol.error("declared_dead", "you were declared dead: register again"))
            return
        w.last_seen = time.monotonic()
        w.alive = True
        w.sample = msg.sample
        for job_id, js in w.sample.get("jobs", {}).items():
            job = self.jobs.get(int(job_id))
            if job is not None:
                for err in js.get("new_errors", []):
                    job.errors.append({"worker": w.id, **err})

    def _on_done(self, ident: bytes, body: list) -> None:
        job = self.jobs.get(body[0]) or self.deploying.get(body[0])  # readers start as soon as deployed
        if job is None or (job.ckpt is not None and self._ckpt_stale_done(job, ident)):
            return
        if job.tracker.progress(body[1], time.monotonic()):
            if job.tracker.credit:
                self._send_credit(job)
            self.dispatch_wake.set()
            if job.tracker.outstanding == 0 and job.queued == 0:
                self._check_waiters(job)

    def _on_reply(self, ident: bytes, msg: protocol.Reply) -> None:
        fut = self.pending_rpcs.pop(msg.req, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _on_error_msg(self, ident: bytes, msg: protocol.Error) -> None:
        log.warning("%r reports a bad message from us: %s %s", ident[:16], msg.reason, msg.detail)

    async def rpc(self, wid: str, mtype: str, body: dict, timeout: float | None = None) -> object:
        """Ask worker `wid` and wait for its reply's result; raises RequestError on failure or timeout."""
        req = next(self._req_ids)
        fut = asyncio.get_running_loop().create_future()
        self.pending_rpcs[req] = fut
        self.rpc_meta[req] = (wid, body.get("job"), mtype)
        await self._send(wid.encode(), protocol.encode(mtype, {**body, "req": req}))
        try:
            reply = await asyncio.wait_for(fut, timeout or self.rpc_timeout)
        except TimeoutError:
            raise NoAnswer(f"worker {wid} did not answer {mtype} within {timeout or self.rpc_timeout} s") from None
        finally:
            self.pending_rpcs.pop(req, None)
            self.rpc_meta.pop(req, None)
        if not reply.ok:
            raise RequestError(f"worker {wid}: {reply.error}")
        return reply.result

    @staticmethod
    def _rpc_failure(message: str) -> Exception:
        return WorkerDied(message)

    def _worker_died(self, wid: str) -> None:
        """Worker `wid` is declared dead: fail what waits on it and recover each of its jobs."""
        self._fail_rpcs_of(wid)
        for job in list(self.jobs.values()):
            if wid in job.workers:
                job.recovering.add(wid)
                self._background(self._recovery(job, wid), f"recovery of job {job.id}")

    async def _recovery(self, job: PlannerJob, wid: str) -> None:
        try:
            await (self._restore if job.ckpt is not None else self._recover)(job, wid)
        finally:
            job.recovering.discard(wid)

    async def _watch_connection(self, wid: str, pusher: DirectSend) -> None:
        """Follow the data connection to worker `wid`: when it drops, the worker may have died."""
        mon = pusher.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        try:
            while True:
                event = parse_monitor_message(await mon.recv_multipart())["event"]
                if self.pushers.get(wid) is not pusher:
                    break  # closed for a restarted worker on other ports: its new connection has its own watch
                if event == zmq.EVENT_DISCONNECTED:
                    self.disconnected[wid] = self.dropped[wid] = time.monotonic()
                else:
                    self.disconnected.pop(wid, None)
        except zmq.ZMQError:
            pass
        finally:
            mon.close(0)

    async def _liveness_loop(self) -> None:
        """Every quarter second: a worker whose connection dropped and who fell silent is dead."""
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for w in list(self.workers.values()):
                since = self.disconnected.get(w.id)
                if (w.alive and since is not None and now - since >= self.dead_after_disconnect / 2
                        and now - w.last_seen >= self.dead_after_disconnect):
                    w.alive = False
                    log.warning("worker %s: its connection dropped and it sent nothing for %.1f s: marked dead",
                                w.id, now - w.last_seen)
                    self._worker_died(w.id)
            for job in list(self.jobs.values()):
                self._check_waiters(job)  # a recovery, rejoin or migration that held it up may be over

    # ----------------------------------------------------------------- jobs
    def _job(self, msg: Any) -> PlannerJob:
        job = self.jobs.get(msg.job)
        if job is None:
            raise RequestError(f"no job {msg.job}")
        return job

    async def _on_submit(self, ident: bytes, msg: protocol.Submit) -> None:
        spec = DagSpec.unpack(msg.dag)
        workers = self.elastic.pool_ids(self.live_workers())
        if not workers:
            raise RequestError("no live workers: start some with `clasp worker --planner ADDR`")
        policy = msg.policy or self.policy
        if policy not in POLICIES:
            raise RequestError(f"unknown policy {policy!r}; accepted: {', '.join(sorted(POLICIES))}")
        state = msg.state or self.state
        if state not in STATE_MODES:
            raise RequestError(f"unknown state mode {state!r}; accepted: {', '.join(STATE_MODES)}")
        explicit = msg.placement
        weights = _key_weights(spec, msg.key_weights or {})
        autoscale = (self.autoscale and not explicit) if msg.autoscale is None else msg.autoscale
        if explicit:
            placement = build_placement(spec, workers, explicit, self.p_max, weights=weights)
        elif autoscale:
            # Eq. (12)'s starting point: everything on one worker until statistics say otherwise.
            placement = build_placement(spec, workers, {o.name: {0: 1.0} for o in spec.operators}, self.p_max)
        else:
            placement = self.placement_fn(spec, workers, self.p_max)
        placement.check(spec)
        try:
            src = list_partitions(spec)
        except Exception as e:  # the source cannot list its partitions here: the submit fails, saying why
            raise RequestError(f"dag {spec.name!r}: listing the partitions of its sources failed: {e}") from None
        if src is not None:
            src.owners = owners_under(src, placement, workers, {})
        job_id = next(self._job_ids)
        job = PlannerJob(job_id, spec, placement, Tracker(), workers, autoscale=autoscale, settled=placement,
                         state=state, key_weights=weights, spec_wire=msg.dag, policy=policy, src=src)
        job.limit = self.bound.limit(None)
        if self._ckpt_enabled(state):
            job.ckpt = self._new_ckpt_state(job_id)
        job.controller = self._controller(spec, policy, len(workers))
        self._set_routes(job)
        peers = {w: self.workers[w].data for w in workers}
        packed = msg.dag
        deploy = {"job": job_id, "dag": packed, "placement": placement.to_wire(), "peers": peers, "state": state,
                  "state_server": self.state_server.endpoint, "run": self._sink_run(job)}
        if src is not None:
            deploy["sources"] = src.wire()
        self.deploying[job_id] = job
        try:
            await asyncio.gather(*(self.rpc(w, "deploy", deploy) for w in workers))
        finally:
            self.deploying.pop(job_id, None)
        self.jobs[job_id] = job
        self._persist_job(job)
        log.info("job %d (%s) placed on %d workers: %s", job_id, spec.name, len(placement.active_workers()),
                 {n: p.shares for n, p in placement.operators.items()})
        self._reply(ident, msg.req, {"job": job_id, "workers": workers, "placement": placement.to_wire(),
                                         "autoscale": autoscale, "policy": policy, "state": state,
                                         "state_server": self.state_server.endpoint})

    def _controller(self, spec, policy: str, workers: int) -> Controller:
        """A job's control loop; its model knows which operators the engines route local first (the
        stateless ones) and which by key."""
        return Controller([o.name for o in spec.operators], spec.edges(), POLICIES[policy](), self.p_max, workers,
                          self.control, stateless=tuple(o.name for o in spec.operators if not o.stateful),
                          keyed=tuple(o.name for o in spec.operators if o.stateful), local_first=True)

    def _set_routes(self, job: PlannerJob) -> None:
        job.routes = [route_to(job.spec, job.placement, s, None) for s in job.spec.sources]
        job.window, job.batch = scheduler.dispatch_limits(self.max_inflight, self.dispatch_batch,
                                                          scheduler.source_holders(job.spec, job.placement),
                                                          len(job.placement.active_workers()))

    def _on_push(self, ident: bytes, msg: protocol.Push, frame: bytes = b"") -> None:
        job = self._job(msg)
        if job.cancelled:
            raise RequestError(f"job {job.id} is cancelled")
        if not job.spec.sources:
            raise RequestError(f"job {job.id} reads only its declared sources "
                               f"({', '.join(job.spec.operators[i].name for i in job.spec.readers)}): its DAG "
                               "has no other root for push() to feed")
        records = msg.records
        if job.deferred_acks:  # a client that pushes on without waiting for its acks: bounded, refused
            check_client_pending(sum(1 for a in job.deferred_acks if a[0] == ident), self.security.limits)
        now = time.monotonic()
        job.clients[ident] = now
        total = charge(len(frame), len(records))  # the frame's bytes: no record is measured on its own
        step = 1 << CHUNK_BITS
        base = 0
        for i in range(0, len(records), step):
            part = records[i:i + step] if len(records) > step else records
            base = job.tracker.admit(len(part), now)
            nbytes = share(total, len(records), i, len(part))
            job.queue.append([base, part, 0])
            job.queue_bytes.admit(nbytes)
            if job.ckpt is not None:  # the whole push in one chunk: its frame is what the log writes
                self._ckpt_on_push(job, base, now, part, nbytes, frame if part is records else None)
            job.queued += len(part)
        job.counters["pushed"] += len(records)
        self.dispatch_wake.set()
        last = base >> CHUNK_BITS
        if (job.deferred_acks or not self.bound.within(job.queued, job.queued_bytes, job.limit)
                or (job.ckpt is not None and not job.ckpt.log.written(last))):
            # backpressure, or the input log has not written it yet: the client waits for this ack
            job.deferred_acks.append((ident, msg.req, len(records), last))
        else:
            self._post(ident, self._push_ack(job, msg.req, len(records)))

    def _release_acks(self, job: PlannerJob) -> None:
        """Acknowledge the deferred pushes, in order, while the job is within its bound and the input log
        has written them."""
        log_ = job.ckpt.log if job.ckpt is not None else None
        acks = job.deferred_acks
        while acks and self.bound.within(job.queued, job.queued_bytes, job.limit) and (
                log_ is None or log_.written(acks[0][3])):
            ident, req, count, _ = acks.popleft()
            self._post(ident, self._push_ack(job, req, count))

    def _log_written(self, job_id: int) -> None:
        """The input log handed back written chunks: their pushes may be acknowledged and dispatched."""
        job = self.jobs.get(job_id)
        if job is not None:
            self._release_acks(job)
            self.dispatch_wake.set()

    def _push_ack(self, job: PlannerJob, req: int, n: int) -> bytes:
        """A push's acknowledgement, with the credit the client may send on (`clasp.core.credit`)."""
        credit = self.bound.credit(job.queued_bytes, job.limit, len(job.clients))
        return protocol.reply(req, {"accepted": n, "credit": credit, "bound": self.bound.max_bytes})

    def _on_wait_idle(self, ident: bytes, msg: protocol.WaitIdle) -> None:
        job = self._job(msg)
        check_client_pending(sum(1 for w in job.waiters if w[0] == ident), self.security.limits)
        job.waiters.append([ident, msg.req, time.monotonic() + float(msg.timeout)])
        self._check_waiters(job)

    def _idle_summary(self, job: PlannerJob) -> dict:
        out = {"pushed": job.counters["pushed"], "completed": job.tracker.completed, "lost": job.tracker.lost}
        if job.src is not None:
            out["read"] = job.tracker.read  # records read from the declared sources
        return out

    def _condition(self, job: PlannerJob) -> scheduler.JobCondition:
        """What `scheduler.busy` and `scheduler.unsettled` decide on, for `job` now."""
        c = job.ckpt
        t = job.tracker
        heard = {w: self.workers[w].last_seen for w in job.workers if w in self.workers}
        return scheduler.JobCondition(
            outstanding=t.outstanding + self._time_pending(job), queued=job.queued,
            suspected=scheduler.suspected(self._job_workers(job), self.dropped, heard),
            recovering=tuple(job.recovering), rolling_back=c is not None and c.restoring,
            orphaned=c is not None and c.orphaned is not None,
            replaying=max(0, c.replay_to - t.completed - t.lost) if c is not None else 0,
            rejoining=(*job.rejoining, *scheduler.expected_rejoins(job.workers, self.refused, time.monotonic())),
            migrating=job.migrating, reading=job.src.reading() if job.src is not None else 0)

    def _check_waiters(self, job: PlannerJob) -> None:
        """Answer the job's `wait_idle` calls if it is idle, once every worker serving it answered that it is
        alive: one killed a moment ago may not have been noticed yet."""
        if job.waiters and not job.confirming and scheduler.busy(self._condition(job)) is None:
            job.confirming = True
            self._background(self._confirm_idle(job), f"idle check of job {job.id}")

    async def _confirm_idle(self, job: PlannerJob) -> None:
        try:
            replies = await asyncio.gather(*(self.rpc(w, "counters", {"job": job.id}, 2.0)
                                             for w in self._job_workers(job)), return_exceptions=True)
            if any(isinstance(r, NoAnswer) for r in replies) or scheduler.busy(self._condition(job)) is not None:
                return  # a worker died (its recovery follows) or the job is busy again: the waiters wait on
            # Idle is not done while a sink has not committed what it was given (tried again each tick).
            admitted = job.tracker.admitted
            if self._has_sinks(job) and (not await self._sinks_settle(job) or job.tracker.admitted != admitted):
                return
        finally:
            job.confirming = False
        if scheduler.busy(self._condition(job)) is not None:
            return
        for ident, req, _ in job.waiters:
            self._reply(ident, req, self._idle_summary(job))
        job.waiters.clear()

    def _job_workers(self, job: PlannerJob) -> list[str]:
        """The job's workers still serving it: alive, and not retired (declared dead while serving it: one
        that comes back has lost the job's state and takes no part in it; a new process with its id does
        once `_redeploy` gave it the job)."""
        return [w for w in job.workers
                if w not in job.retired and self.workers.get(w) and self.workers[w].alive]

    async def _on_state(self, ident: bytes, msg: protocol.StateRequest) -> None:
        job = self._job(msg)
        op = job.spec.by_name(msg.op) if msg.op in {o.name for o in job.spec.operators} else None
        if op is None:
            raise RequestError(f"job {job.id} has no operator {msg.op!r}")
        if not op.stateful:
            raise RequestError(f"operator {op.name!r} is stateless: it has no state")
        if job.state == "remote":
            self._reply(ident, msg.req, self.state_server.dump(job.id, op.name))
            return

        async def dump() -> dict:
            owners = sorted(set(job.placement.operators[op.name].key_groups))
            parts = await asyncio.gather(*(self.rpc(w, "state_dump", {"job": job.id, "op": op.name})
                                           for w in owners))
            merged: dict = {}
            for p in parts:
                merged.update(p)
            return merged

        self._reply(ident, msg.req, await self._when_serving(job, msg, dump))

    async def _on_collected(self, ident: bytes, msg: protocol.Collected) -> None:
        job = self._job(msg)
        if msg.op not in {o.name for o in job.spec.operators}:
            raise RequestError(f"job {job.id} has no operator {msg.op!r}")

        async def dump() -> list:
            parts = await asyncio.gather(*(self.rpc(w, "collected_dump", {"job": job.id, "op": msg.op})
                                           for w in self._job_workers(job)))
            return [*(job.ckpt.released(msg.op) if job.ckpt is not None else []), *(x for p in parts for x in p)]

        async def locked_dump() -> list:
            async with job.lock:  # not while a checkpoint carries outputs from the workers to the planner
                return await dump()

        self._reply(ident, msg.req, await self._when_serving(job, msg, locked_dump if job.ckpt is not None else dump))

    async def _when_serving(self, job: PlannerJob, msg: protocol.StateRequest, ask: Callable) -> Any:
        """`await ask()` (a question to the job's workers) once the job serves: not while a worker of it may
        have died, a recovery is under way or its replay has not caught up (`scheduler.unsettled`); asked
        again when a worker dies before it answers. Within the request's timeout: past it, the error says
        what the job is still doing."""
        deadline = time.monotonic() + (ANSWER_TIMEOUT if msg.timeout is None else msg.timeout)
        while True:
            why = scheduler.unsettled(self._condition(job))
            if why is None:
                try:
                    return await ask()
                except WorkerDied as e:
                    why = f"is recovering: {e}"
            if job.cancelled or self.jobs.get(job.id) is not job:
                raise RequestError(f"job {job.id} was cancelled")
            if time.monotonic() >= deadline:
                raise RequestError(f"timeout: job {job.id} {why}")
            await asyncio.sleep(SETTLE_POLL)

    def _on_stats(self, ident: bytes, msg: protocol.Stats):
        job = self._job(msg)
        if msg.fresh:
            return self._fresh_stats(ident, msg, job)
        self._reply(ident, msg.req, self.job_stats(job))
        return None

    async def _fresh_stats(self, ident: bytes, msg: protocol.Stats, job: PlannerJob) -> None:
        """Stats with exact cumulative counters asked of every worker now."""
        workers = self._job_workers(job)
        counters = await asyncio.gather(*(self.rpc(w, "counters", {"job": job.id}) for w in workers))
        self._reply(ident, msg.req, self.job_stats(job, dict(zip(workers, counters, strict=True))))

    async def _on_cancel(self, ident: bytes, msg: protocol.Cancel) -> None:
        job = self._job(msg)
        job.cancelled = True
        job.queue.clear()
        job.queue_bytes.clear()
        job.queued = 0
        await asyncio.gather(*(self.rpc(w, "stop_job", {"job": job.id}) for w in self._job_workers(job)),
                             return_exceptions=True)
        self.jobs.pop(job.id, None)
        self.state_server.drop(job.id)
        if job.ckpt is not None:
            job.ckpt.log.close()
            await asyncio.to_thread(self.store.delete_job, job.id)
        self._reply(ident, msg.req, True)

    def _on_jobs(self, ident: bytes, msg: protocol.Jobs) -> None:
        self._reply(ident, msg.req, [{"job": j.id, "name": j.spec.name, "pushed": j.counters["pushed"],
                                          "completed": j.tracker.completed} for j in self.jobs.values()])

    def _on_workers(self, ident: bytes, msg: protocol.Workers) -> None:
        self._reply(ident, msg.req, [{"id": w.id, "alive": w.alive, "data": w.data, "state": w.state,
                                          "metrics": w.metrics, "pid": w.pid, "host": w.host}
                                         for w in self.workers.values()])

    # ----------------------------------------------------------------- scaling and migration
    async def _on_scale(self, ident: bytes, msg: protocol.Scale) -> None:
        job = self._job(msg)
        n = msg.workers
        pool = self._pool(job)
        if not 1 <= n <= self.elastic.max_pool(len(pool)):
            raise RequestError(f"scale to {n} workers: the job's pool has {len(pool)} live workers")
        if n > len(pool):
            pool = await self.elastic.acquire(job, n)  # the provider starts them; they join the pool
            if n > len(pool):
                raise RequestError(f"scale to {n} workers: asked the {self.elastic.provider.name} provider, "
                                   f"{len(pool)} are in the job's pool after {self.elastic.config.join_timeout:g} s")
        async with job.lock:
            pool = self._pool(job)
            result = job.controller.place_on(n, pool)
            job.decisions.append({"t": round(time.time() - job.created, 3), "trigger": f"job.scale({n})",
                                  "reason": result.reason or f"manual scale to {n} workers", "change": True,
                                  "workers": result.workers, "predicted_rate": result.rate})
            record = await self._place_result(job, result, f"manual scale to {n} workers", pool)
        self._reply(ident, msg.req, record)

    async def _on_place(self, ident: bytes, msg: protocol.Place) -> None:
        """Migrate to an explicit placement, operator -> {pool index -> share} (pool: active workers first)."""
        job = self._job(msg)
        async with job.lock:
            pool = pool_order(job.placement, self.elastic.pool_ids(self._job_workers(job)))
            new = build_placement(job.spec, pool, msg.placement, self.p_max, job.placement.epoch + 1,
                                  previous=job.placement, weights=job.key_weights)
            record = await self._run_migration(job, new, "manual placement")
        self._reply(ident, msg.req, record)

    def _on_autoscale(self, ident: bytes, msg: protocol.Autoscale) -> None:
        job = self._job(msg)
        job.autoscale = msg.enabled
        log.info("job %d: autoscaling %s", job.id, "on" if job.autoscale else "off")
        self._reply(ident, msg.req, job.autoscale)

    async def _apply_decision_locked(self, job: PlannerJob, result, reason: str, pool: list[str]) -> None:
        """A control-loop decision, taken in the background: `_place_result` under the job's lock."""
        async with job.lock:
            serving = set(self._job_workers(job))
            # A worker of the decision's pool that died since: its indices mean nothing now; re-map to today's.
            await self._place_result(job, result, reason, pool if serving.issuperset(pool) else None)

    def _pool(self, job: PlannerJob) -> list[str]:
        """The worker ids behind the policy's indices: larger CPU allowances first (`pool_order`)."""
        return pool_order(job.placement, self.elastic.pool_ids(self._job_workers(job)),
                          {w: self.workers[w].sample.get("cpus") for w in job.workers if w in self.workers})

    async def _place_result(self, job: PlannerJob, result, reason: str, pool: list[str] | None = None) -> dict:
        """Carry out a policy's placement with the decentralized protocol; returns the migration record.
        `pool`: the ids the policy's indices meant when it decided (default: the pool now)."""
        pool = self._pool(job) if pool is None else pool
        new = to_runtime_placement(job.spec, result, pool, job.placement, job.placement.epoch + 1, job.key_weights)
        if job.src is not None:
            new = readers_follow(job.spec, new)
        record = await self._run_migration(job, new, reason)
        job.controller.placed(result)
        return record

    async def _run_migration(self, job: PlannerJob, new: Placement, reason: str) -> dict:
        """Steps 1, 2 and 7 of the protocol: plan, broadcast, wait for every participant's completion."""
        serving = set(self._job_workers(job))
        dead = sorted(w for w in job.workers if w not in serving)
        old = job.placement
        plan = plan_migration(job.spec, old, new, job.workers, dead)
        t0 = time.monotonic()
        job.migrating = True
        marker = protocol.encode("marker", [job.id, new.epoch, PLANNER])
        for w in plan.markers_to_send(PLANNER):
            self.pushers[w].send(marker)
        job.placement = new
        self._set_routes(job)  # records dispatched from now on follow the new epoch
        body = {"job": job.id, "plan": plan.to_wire(), "placement": new.to_wire()}
        replies = await asyncio.gather(*(self.rpc(w, "migrate_plan", body, self.migration_timeout)
                                         for w in plan.participants), return_exceptions=True)
        if job.src is not None:
            await self._move_partitions(job)
        duration = time.monotonic() - t0
        job.migrating = False
        self.dispatch_wake.set()
        record = scheduler.migration_record(old, new, reason, time.time() - job.created, duration,
                                            plan.participants, replies, plan.moved_groups(), dead)
        failed = record["failed"]
        job.migrations.append(record)
        if not failed:
            job.settled = new
        self.rescales += 1
        self.migration_hist["planner"].add(duration)
        for r in replies:
            if isinstance(r, dict):
                self.migration_hist["worker"].add(r["pause"])
        if failed:
            log.error("job %d migration to epoch %d failed on %s after %.3f s: %s", job.id, new.epoch,
                      sorted(failed), duration, failed)
        log.info("job %d migrated to epoch %d: %d -> %d workers in %.1f ms (max worker pause %.1f ms, "
                 "%d bytes, %d state objects, %d requests): %s", job.id, new.epoch, record["from_workers"],
                 record["to_workers"], duration * 1e3, record["max_pause_s"] * 1e3, record["bytes"],
                 record["objects"], record["rows"], reason)
        return record

    async def _recover(self, job: PlannerJob, wid: str) -> None:
        """A worker of the job died: re-place its share on the workers that remain (its state is lost)."""
        async with job.lock:
            old = job.placement
            if wid not in job.workers or wid in job.retired:
                return
            # Even when it held nothing any more, a plan naming it dead releases peers waiting for it.
            job.lost_workers.add(wid)
            job.retired.add(wid)
            alive = self._job_workers(job)
            if not alive:
                log.error("job %d lost its last worker %s", job.id, wid)
                return
            r = scheduler.plan_recovery(job.spec, old, job.settled, wid, alive, job.queue, job.tracker.next_chunk,
                                        job.key_weights, time.time() - job.created)
            job.decisions.append(r.decision)
            job.tracker.suspect_below(r.fence)
            self.dispatch_wake.set()
            await self._run_migration(job, r.placement, r.reason)

    def _sweep_lost(self, job: PlannerJob, clean: bool) -> None:
        """After a worker died, records whose weight died with it never complete. A check is clean when
        no survivor holds anything of a suspect record; after two clean checks a tick apart with no suspect
        completing in between (a request on the wire between survivors shows up in one of them), count
        the suspects still open as lost."""
        t = job.tracker
        job.sweep, lose = scheduler.sweep_step(job.sweep, t.suspects, job.migrating, clean)
        if not lose:
            return
        n = t.lose_suspects()
        self.records_lost += n
        log.error("job %d: %d records lost with worker(s) %s", job.id, n, ",".join(sorted(job.lost_workers)))
        job.errors.append(scheduler.lost_error(n, job.lost_workers))
        if t.outstanding == 0 and job.queued == 0:
            self._check_waiters(job)

    async def _check_idle(self, job: PlannerJob) -> None:
        workers = self._job_workers(job)
        body = {"job": job.id, "below": job.tracker.fence}
        try:
            counters = await asyncio.gather(*(self.rpc(w, "counters", body, 2.0) for w in workers))
        except RequestError:
            return
        self._sweep_lost(job, not any(c["holds_below"] for c in counters))

    def _control(self, job: PlannerJob, rate_in: float, rate_out: float) -> None:
        """One control-loop tick for one job: feed the estimator, and re-plan when a trigger fires."""
        pool = self._pool(job)
        samples = {w: self.workers[w].sample for w in job.workers if w in self.workers}
        job.key_weights = key_weights(job.spec, samples, job.id, job.key_weights)
        obs = observation(job.spec, samples, job.id, rate_in, rate_out, job.tracker.completed, job.queued,
                          job.placement, pool)
        job.controller.pool = self.elastic.max_pool(len(pool))  # the provider's ceiling: workers that may join
        step = job.controller.observe(obs, decide=job.autoscale and not job.migrating
                                      and job.id not in self.elastic.waiting)
        e = step.estimate
        job.estimate = {"alpha": e.alpha, "beta": e.beta, "beta_receive": e.beta_receive, "mu": e.mu,
                        "gamma": e.gamma, "capacity": e.capacity, "flush_delay": e.flush_delay,
                        "capacities": {w: round(c, 1) for w, c in e.capacities.items()}, "terms": dict(e.terms),
                        "observations": job.controller.estimator.observations,
                        "saturated": list(e.saturated), "reason": e.reason}
        if step.trigger is None:
            return
        d = step.decision
        entry = {"t": round(time.time() - job.created, 3), "trigger": step.trigger, "reason": d.reason,
                 "change": d.change, "workers": d.workers, "predicted_rate": d.placement.rate if d.change else None}
        job.decisions.append(entry)
        log.info("job %d: %s -> %s", job.id, step.trigger, d.reason if d.change else f"no change: {d.reason}")
        if d.change and d.placement.workers > len(pool):
            self._background(self.elastic.decide_later(job, d.placement.workers, f"{step.trigger}: {d.reason}"),
                             f"re-placement of job {job.id} on workers asked for")
        elif d.change:
            self._background(self._apply_decision_locked(job, d.placement, f"{step.trigger}: {d.reason}", pool),
                             f"re-placement of job {job.id}")

    # ----------------------------------------------------------------- the scheduling engine
    async def _dispatch_loop(self) -> None:
        while True:
            sent = 0
            for job in list(self.jobs.values()):
                sent += self._dispatch(job)
            if sent:
                await asyncio.sleep(0)
                continue
            self.dispatch_wake.clear()
            await self.dispatch_wake.wait()

    def _dispatch(self, job: PlannerJob) -> int:
        """Send queued records to the source operators' workers while the in-flight window has room."""
        if job.ckpt is not None and not self._ckpt_may_dispatch(job):
            return 0
        head = job.queue[0] if job.queue else None
        if head is not None and head[1] is None:  # a replayed chunk, read from the input log when it is due
            head[1] = job.ckpt.log.records(head[0] >> CHUNK_BITS)
        size, offset = (len(head[1]), head[2]) if head else (0, 0)
        d = scheduler.dispatch(job.queue, job.spec, job.routes,
                               scheduler.window_room(job.window, job.inflight, job.batch))
        if d is None:
            return 0
        n = d.count
        job.queued -= n
        job.drained += job.queue_bytes.taken(size, offset, n)
        if not job.queued:
            job.backlog = False
        job.counters["dispatched"] += n
        epoch = job.placement.epoch
        for dest, rows in d.data.items():
            self.pushers[dest].send(protocol.encode("data", [job.id, epoch, rows]), copy=False)
        for dest, rs in d.runs.items():
            self.pushers[dest].send(protocol.encode("runs", [job.id, epoch, rs]), copy=False)
        if d.failed:
            job.errors.extend(d.errors)
            job.counters["source_errors"] += len(d.failed)
        if job.tracker.dispatched(d.first, n, d.counts, time.monotonic()) and not job.tracker.outstanding:
            self._wake_waiters(job)
        if job.deferred_acks:
            self._release_acks(job)
        return n

    # ----------------------------------------------------------------- once a second
    async def _tick_loop(self) -> None:
        last = time.monotonic()
        prev: dict[int, tuple[int, int]] = {}
        while True:
            await asyncio.sleep(self.heartbeat)
            now = time.monotonic()
            dt = max(now - last, 1e-6)
            last = now
            for w in self.workers.values():
                if w.alive and now - w.last_seen > self.dead_after:
                    w.alive = False
                    log.warning("worker %s missed heartbeats for %.1f s: marked dead", w.id, now - w.last_seen)
                    self._worker_died(w.id)
            total_in = total_out = 0.0
            for job in list(self.jobs.values()):
                p_in, p_out = prev.get(job.id, (0, 0))
                rate_in = (job.counters["pushed"] - p_in) / dt
                rate_out = (job.tracker.completed - p_out) / dt
                prev[job.id] = (job.counters["pushed"], job.tracker.completed)
                self._drain_tick(job, dt, now)
                self._time_tick(job)
                interval = job.tracker.interval
                self.latency.merge(interval)
                lat = job.tracker.take_interval()
                job.last = {"t": round(time.time() - job.created, 3), "input_rate": rate_in, "throughput": rate_out,
                            "queue": job.queued, "queued_bytes": job.queued_bytes,
                            "inflight": job.inflight, "p50": lat["p50"], "p95": lat["p95"],
                            "p99": lat["p99"], "workers": len(job.placement.active_workers())}
                job.series.append(job.last)
                self._control(job, rate_in, rate_out)
                if job.tracker.suspects and not job.migrating:
                    self._background(self._check_idle(job), f"idle check of job {job.id}")
                total_in += rate_in
                total_out += rate_out
                expired = [x for x in job.waiters if x[2] <= now]
                why = (scheduler.busy(self._condition(job)) or self._sinks_unsettled(job)
                       or "has not heard from all its workers yet" if expired else None)
                for waiter in expired:
                    job.waiters.remove(waiter)
                    self._reply_error(waiter[0], waiter[1], RequestError(f"timeout: job {job.id} {why}"))
            self.last_rates = {"input_rate": total_in, "throughput": total_out}
            self.elastic.tick()

    def _drain_tick(self, job: PlannerJob, dt: float, now: float) -> None:
        """Once a tick: the queue's drain rate, the job's limit from it, and the clients still pushing."""
        job.drain = drain_rate(job.drain, job.drained, dt, job.backlog and job.queued > 0)
        job.drained = 0
        job.backlog = job.queued > 0
        job.limit = self.bound.limit(job.drain)
        for ident in [i for i, t in job.clients.items() if now - t > CLIENT_IDLE]:
            del job.clients[ident]
        if job.deferred_acks:  # the limit may have grown
            self._release_acks(job)

    def job_stats(self, job: PlannerJob, counters: dict | None = None) -> dict:
        """Throughput, input rate, latency, and the Table 2 metrics of every worker, for one job
        (`scheduler.job_stats`; `counters`: worker -> its exact cumulative counters)."""
        return {**scheduler.job_stats(job, self.workers, len(self.live_workers()), counters),
                "queue_bound": {"records": self.bound.max_records, "bytes": self.bound.max_bytes,
                                "max_delay": self.bound.max_delay, "limit": job.limit,
                                "drain_bytes_per_s": job.drain},
                "checkpoints": self.ckpt_stats(job), "sinks": self.sink_stats(job), "sources": self.source_stats(job),
                "event_time": self.time_stats(job)}


class _PlannerCollector:
    """Prometheus view of the planner, read at scrape time."""

    def __init__(self, planner: Planner):
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
                               "(--max-inflight, or 2,000 per worker it spans)", labels=["job"])
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
        r.add_metric([], p.rescales)
        yield r
        lost = CounterMetricFamily("clasp_records_lost", "Records given up on because a worker holding "
                                   "part of them died")
        lost.add_metric([], p.records_lost)
        yield lost
        yield from p.ckpt_metrics(jobs, _buckets)
        yield from p.time_metrics(jobs)
        mh = HistogramMetricFamily("clasp_migration_duration_seconds",
                                   "Planner: plan issued to last completion; worker: plan received to resumed",
                                   labels=["role"])
        for role, hist in p.migration_hist.items():
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
