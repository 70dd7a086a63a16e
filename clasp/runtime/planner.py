"""The planner process: its wiring, the message table of its ROUTER, the worker registry (register,
heartbeat, a worker's death), job submission and cancellation, and the once-a-second tick.

One ROUTER socket serves workers (register, heartbeat, done, replies) and clients (submit, push, ...);
a PUSH per worker carries input records to the workers holding the DAG's source operators. The planner
never executes an operator and never relays chained requests between workers. What it does with a job
is its collaborators' (docs/ARCHITECTURE.md, "The planner"): the dispatcher (planner_dispatch), the
queries (planner_queries), the migration runner (planner_migration), the checkpoint coordinator
(planner_recovery), the sources and sinks coordinators, the elastic pool, and the link to its peers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry
from zmq.utils.monitor import parse_monitor_message

from clasp.core import protocol, scheduler
from clasp.core.control import (
    ControlConfig,
)
from clasp.core.credit import (
    QueueBound,
)
from clasp.core.dag import DagSpec
from clasp.core.job_machine import JobMachine, Progress
from clasp.core.lifecycle import (
    DropInput,
    Forget,
    JobLife,
    Phase,
    Replan,
    Retire,
    StartRollback,
    StopWorkers,
    WorkerDied,
)
from clasp.core.limits import LimitError, check_client_pending, check_dag
from clasp.core.policies import POLICIES
from clasp.core.protocol import ProtocolError
from clasp.core.routing import (
    NUM_KEY_GROUPS,
    Placement,
    build_placement,
    spread_placement,
)
from clasp.core.scheduler import WorkerInfo
from clasp.core.tracking import LatencyHistogram, Tracker
from clasp.runtime.config import STATE_MODES, PlannerConfig
from clasp.runtime.dashboard import Dashboard, planner_view
from clasp.runtime.elastic import ElasticPool
from clasp.runtime.net import (
    DirectSend,
    ServerLoop,
    advertised,
    bind,
    request_id,
    start_metrics_server,
    zero_copy,
)
from clasp.runtime.planner_dispatch import Dispatcher
from clasp.runtime.planner_job import PlannerJob
from clasp.runtime.planner_link import Link, RequestError, error_frame
from clasp.runtime.planner_metrics import PlannerCollector
from clasp.runtime.planner_migration import Migrations
from clasp.runtime.planner_queries import JobQueries
from clasp.runtime.planner_recovery import Checkpoints
from clasp.runtime.planner_sinks import SinkCoordinator
from clasp.runtime.planner_sources import SourcesCoordinator, list_partitions, owners_under
from clasp.runtime.planner_time import TimeCoordinator
from clasp.runtime.providers import Provider
from clasp.runtime.security import Security
from clasp.runtime.state_server import StateServer
from clasp.runtime.state_store import FileStore, check_state_dir
from clasp.runtime.tasks import ProcessTasks

log = logging.getLogger("clasp.planner")
CANCEL_TIMEOUT = 3.0  # s a cancel waits for each worker to stop the job (the client waits 10 s by default)

PlacementFn = Callable[..., Placement]  # (spec, workers, p_max, weights=...): `spread_placement`'s form


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


def each_seal(on_seal: Callable[[bytes, list], None]) -> Callable[[bytes, list], None]:
    """The handler of `seals` (the seals of one turn of a worker's readers, in the order admitted): `on_seal`
    for each, as if it had come alone."""
    def on_seals(ident: bytes, body: list) -> None:
        for seal in body[1]:
            on_seal(ident, [body[0], *seal])
    return on_seals


def in_turn(*handlers: Callable[[bytes, object], None]) -> Callable[[bytes, object], None]:
    """One message's handler that runs each of `handlers` on it, in order."""
    def on_message(ident: bytes, body: object) -> None:
        for handler in handlers:
            handler(ident, body)
    return on_message


class Planner:
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
        self.heartbeat, self.dead_after = config.heartbeat, config.dead_after
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
        self.bad_messages: dict[str, int] = {}
        self.latency = LatencyHistogram()
        self.last_rates = {"input_rate": 0.0, "throughput": 0.0}
        self.tasks = ProcessTasks(log)  # every task of this process; cancelled together when serve() ends
        self.link = Link(self.security, self.rpc_timeout, self.tasks)  # sends, requests to workers, tasks
        self.queries = JobQueries(
            self.link, self.security.limits, self.jobs, self.workers, self.dropped, self.refused, stats=self.job_stats,
            remote_state=lambda job_id, op: self.state_server.dump(job_id, op),
            has_sinks=SinkCoordinator.has_sinks, settle_sinks=lambda job: self.sinks.settle(job),
            time_pending=lambda job: self.time.pending(job))
        self.elastic = ElasticPool(self.link, self.jobs, self.workers, self.pushers, self.queries,  # join, drain
                                   live_workers=self.live_workers, state_endpoint=lambda: self.state_server.endpoint,
                                   provider=provider)
        self.dispatcher = Dispatcher(self.link, self.security.limits, self.bound, self.jobs, self.pushers,
                                     max_inflight=self.max_inflight, dispatch_batch=self.dispatch_batch,
                                     job_of=self.queries.job, changed=self.queries.check_waiters,
                                     chunk_begins=lambda job, chunk: self.time.pushed(job, chunk))
        checkpoint = lambda job: self.checkpoints.checkpoint(job)  # noqa: E731 (built below, with what it needs)
        self.sinks = SinkCoordinator(self.link, self.queries.workers_of, checkpoint, self.queries.check_waiters)
        reading_job = lambda i: self.jobs.get(i) or self.deploying.get(i)  # noqa: E731 (also while it deploys)
        self.sources = SourcesCoordinator(
            self.link, reading_job=reading_job, job_of=self.queries.job, workers_of=self.queries.workers_of,
            changed=self.queries.check_waiters, checkpoint=checkpoint, stale=lambda j, w: j.machine.stale(w),
            busy=lambda job: scheduler.busy(self.queries.condition(job)), summary=self.queries.summary)
        self.time = TimeCoordinator(self.link, self.jobs, reading_job=reading_job, workers_of=self.queries.workers_of,
                                    changed=self.queries.check_waiters)
        self.checkpoints = Checkpoints(
            self.link, self.store, self.jobs, self.workers, self.queries, self.dispatcher, self.sinks, self.sources,
            self.time,
            interval=self.checkpoint_interval, input_log_records=self.input_log_records,
            log_bytes=self.bound.max_bytes // 4, collected_memory=config.collected_memory, dead_after=self.dead_after,
            state_endpoint=lambda: self.state_server.endpoint)
        self.migrations = Migrations(self.link, self.queries, self.dispatcher, self.sources, self.elastic, self.workers,
                                     self.pushers, p_max=self.p_max, control=self.control,
                                     migration_timeout=self.migration_timeout, rebalance=config.rebalance)
        self.elastic.migrations = self.migrations  # each asks the other: the pool's workers, a migration
        self.dispatcher.send_credit = self.sources.send_credit
        self.dispatcher.bad = self._bad
        self.started = time.monotonic()

    # ----------------------------------------------------------------- lifecycle
    async def serve(self) -> None:
        self.security.start_zap(self.ctx)
        self.router = self.security.server(self.ctx.socket(zmq.ROUTER), "planner")
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.router.setsockopt(zmq.RCVHWM, self.security.limits.router_rcvhwm)
        self.port = bind(self.router, self.host, self.port)
        self.link.server = self._server()
        self.endpoint = f"tcp://{self.advertise}:{self.port}"
        registry = CollectorRegistry()
        registry.register(PlannerCollector(self))
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
            loops = [self.link.server.serve(), self.dispatcher.run(), self._tick_loop(), self.state_server.serve(),
                     self.security.run(), self._liveness_loop(), self.time.run()]
            self._load_stored_jobs()
            if self.store is not None:
                loops.append(self.checkpoints.run())
            await self.tasks.run(*loops)
        finally:
            self.ctx.destroy(linger=200)

    def _load_stored_jobs(self) -> None:
        """A planner restarted on a state directory takes up the jobs it finds there (docs/RECOVERY.md)."""
        top = 0
        for stored in self.checkpoints.stored_jobs():
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
            job.controller = self.migrations.controller(spec, job.policy, len(workers))
            job.ckpt = self.checkpoints.for_job(job.id, job.state, stored=True)
            job.machine = JobMachine(job, self.bound, JobLife(True, Phase.TAKEN_UP))  # held until its rollback
            self.checkpoints.revive(job, stored)
            self.dispatcher.set_routes(job)
            self.jobs[job.id] = job
            top = max(top, job.id)
            log.warning("job %d (%s) taken up from %s: %d complete checkpoints, %d records to replay", job.id,
                        spec.name, self.store.root, len(stored["complete"]), job.tracker.outstanding)
            self.link.background(self.checkpoints.resume(job), f"resuming job {job.id}")
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
    def _bad(self, e: ProtocolError) -> None:
        self.bad_messages[e.reason] = self.bad_messages.get(e.reason, 0) + 1
        log.warning("dropped a bad message: %s", e)

    def _server(self) -> ServerLoop:
        q, src, pool, mig, tm, d = self.queries, self.sources, self.elastic, self.migrations, self.time, self.dispatcher
        seal = in_turn(src.on_seal, tm.on_seal)  # a chunk of fired windows counts as on its way until it is sealed
        handlers = {
            "register": self._on_register, "heartbeat": self._on_heartbeat, "reply": self.link.on_reply,
            "done": in_turn(self._on_done, tm.may_move), "error": self._on_error_msg, "submit": self._on_submit,
            "push": d.on_push, "cancel": self._on_cancel, "jobs": q.on_jobs, "workers": q.on_workers,
            "wait_idle": q.on_wait_idle, "state": q.on_state, "collected": q.on_collected, "stats": q.on_stats,
            "scale": mig.on_scale, "place": mig.on_place, "autoscale": mig.on_autoscale, "wm_push": tm.on_wm_push,
            "drain": pool.on_drain, "leave": pool.on_leave, "pool": pool.on_pool, "end_input": d.on_end_input,
            "lease": src.on_lease, "seal": seal, "seals": each_seal(seal), "stop": src.on_stop, "wm_out": tm.on_wm_out,
            "read_end": in_turn(src.on_read_end, tm.may_move), "wm_idle": tm.on_wm_idle, "wm_fired": tm.on_wm_fired}
        return ServerLoop(self.router, handlers, where="the planner", on_bad=self._bad, on_failure=self._failed,
                          decode=protocol.decode_message, spawn=self._spawn_handler, raw=frozenset({"push"}),
                          admit=self._admit, drain=True)

    def _admit(self, ident: bytes, mtype: str, body, frame: bytes) -> None:
        """Limits checked before a handler runs: a DAG's size, a client's requests in flight."""
        if mtype == "submit":
            check_dag(len(frame), body.dag.get("functions"), self.security.limits)
        tasks = self.client_tasks.get(ident, 0)
        if tasks:
            check_client_pending(tasks, self.security.limits)

    def _spawn_handler(self, ident: bytes, mtype: str, body, coro) -> None:
        # Slow handlers (they wait on workers) run on their own so the loop keeps receiving.
        self.client_tasks[ident] = self.client_tasks.get(ident, 0) + 1
        self.link.background(self._finish(ident, mtype, body, coro), f"handling {mtype}")

    def _failed(self, ident: bytes, mtype: str, body, e: Exception) -> bytes:
        if isinstance(e, LimitError):
            self.security.rejected(e.limit)
            log.warning("refused %s from %r: %s", mtype, ident[:16], e)
        return error_frame(request_id(body), e, mtype)

    async def _finish(self, ident, mtype: str, body, coro) -> None:
        try:
            await coro
        except Exception as e:
            self.link.reply_error(ident, getattr(body, "req", 0), e, mtype)
        finally:
            n = self.client_tasks.pop(ident, 1) - 1
            if n > 0:
                self.client_tasks[ident] = n

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
            self.link.background(self._watch_connection(wid, pusher), f"watching the connection to {wid}")
        log.info("worker %s registered (data %s, metrics %s, pid %d)", wid, info.data, info.metrics, info.pid)
        self.link.post(ident, protocol.pack(protocol.Welcome(self.id, self.heartbeat)))
        if restarted:
            for job in list(self.jobs.values()):
                if wid in job.workers:
                    job.rejoining.add(wid)
                    self.link.background(self._redeploy(job, wid), f"deploying job {job.id} on restarted worker {wid}")
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
        return not any(prev.id in job.workers and job.ckpt.recovering(job, prev.id)
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
            if self.jobs.get(job.id) is not job or job.life.retired:
                return
            if job.life.orphaned is not None:
                job.retired.discard(wid)
                await self.checkpoints.resume_orphan(job)  # it had no worker left: it recovers onto this one
                return
            peers = {w: self.workers[w].data for w in job.workers if w in self.workers}
            await self.link.rpc(wid, protocol.Deploy(job.id, job.spec.pack(), job.placement.to_wire(), peers,
                                                     state=job.state, state_server=self.state_server.endpoint,
                                                     floor=job.ckpt.floor(job.placement), run=self.sinks.run(job)))
            job.retired.discard(wid)  # a new process with nothing of the job: it may be placed on again
            log.info("job %d deployed on restarted worker %s (epoch %d, holding nothing)", job.id, wid,
                     job.placement.epoch)

    def _on_heartbeat(self, ident: bytes, msg: protocol.Heartbeat) -> None:
        w = self.workers.get(msg.id)
        if w is None or ident != w.id.encode():
            self.link.post(ident, protocol.error("unknown_worker", "register first"))
            return
        if not w.alive:
            # Declared dead: its jobs were recovered without it. It is told so, and registers again as new.
            log.info("worker %s is back after it was declared dead: it re-registers as a new worker", w.id)
            self.link.post(ident, protocol.error("declared_dead", "you were declared dead: register again"))
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
        if job is not None:
            self.dispatcher.carry_out(job, job.machine.handle(Progress(ident, body[1], time.monotonic(), body[2])))

    def _on_error_msg(self, ident: bytes, msg: protocol.Error) -> None:
        log.warning("%r reports a bad message from us: %s %s", ident[:16], msg.reason, msg.detail)

    def _worker_died(self, wid: str) -> None:
        """Worker `wid` is declared dead: fail what waits on it and recover each of its jobs."""
        steps = {job.id: job.machine.handle(WorkerDied(wid)) for job in list(self.jobs.values()) if wid in job.workers}
        self.checkpoints.fail_requests_of(wid)  # every FailRequests of the worker's jobs: one call covers them
        for job_id, out in steps.items():
            job = self.jobs[job_id]
            for step in out:
                if isinstance(step, (StartRollback, Replan)):
                    job.recovering.add(wid)
                    self.link.background(self._recovery(job, wid, step), f"recovery of job {job.id}")

    async def _recovery(self, job: PlannerJob, wid: str, step: StartRollback | Replan) -> None:
        try:
            await (self.checkpoints.restore if isinstance(step, StartRollback) else self.migrations.recover)(job, wid)
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
                self.queries.check_waiters(job)  # a recovery, rejoin or migration that held it up may be over

    # ----------------------------------------------------------------- jobs
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
            placement = self.placement_fn(spec, workers, self.p_max, weights=weights)
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
        job.ckpt = self.checkpoints.for_job(job_id, state)
        job.machine = JobMachine(job, self.bound, JobLife(job.ckpt.enabled))
        job.controller = self.migrations.controller(spec, policy, len(workers))
        self.dispatcher.set_routes(job)
        peers = {w: self.workers[w].data for w in workers}
        deploy = protocol.Deploy(job_id, msg.dag, placement.to_wire(), peers, state=state,
                                 state_server=self.state_server.endpoint, run=self.sinks.run(job),
                                 sources=src.wire() if src is not None else None)
        self.deploying[job_id] = job
        try:
            await asyncio.gather(*(self.link.rpc(w, deploy) for w in workers))
        finally:
            self.deploying.pop(job_id, None)
        self.jobs[job_id] = job
        self.checkpoints.deployed(job)
        log.info("job %d (%s) placed on %d workers: %s", job_id, spec.name, len(placement.active_workers()),
                 {n: p.shares for n, p in placement.operators.items()})
        self.link.reply(ident, msg.req, {"job": job_id, "workers": workers, "placement": placement.to_wire(),
                                         "autoscale": autoscale, "policy": policy, "state": state,
                                         "state_server": self.state_server.endpoint})

    async def _on_cancel(self, ident: bytes, msg: protocol.Cancel) -> None:
        job = self.queries.job(msg)
        if job.life.retired:  # cancelled twice: the first cancel answers for the job
            raise RequestError(f"job {job.id} is cancelled")
        for step in job.machine.handle(Retire()):
            if isinstance(step, DropInput):
                job.clear_queue()
            elif isinstance(step, StopWorkers):  # one silent for CANCEL_TIMEOUT is dead or stuck: no longer
                await asyncio.gather(*(self.link.rpc(w, protocol.StopJob(job.id), CANCEL_TIMEOUT)
                                       for w in self.queries.workers_of(job)), return_exceptions=True)
            elif isinstance(step, Forget):
                self.jobs.pop(job.id, None)
                self.state_server.drop(job.id)
                job.ckpt.close()
                self.link.reply(ident, msg.req, True)
                if step.delete_files:  # after the answer: a busy disk is slow
                    self.tasks.spawn(asyncio.to_thread(self.store.delete_job, job.id), f"deleting job {job.id}")

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
                self.dispatcher.drain_tick(job, dt, now)
                self.time.tick(job)
                interval = job.tracker.interval
                self.latency.merge(interval)
                lat = job.tracker.take_interval()
                job.last = {"t": round(time.time() - job.created, 3), "input_rate": rate_in, "throughput": rate_out,
                            "queue": job.queued, "queued_bytes": job.queued_bytes,
                            "inflight": job.inflight, "p50": lat["p50"], "p95": lat["p95"],
                            "p99": lat["p99"], "workers": len(job.placement.active_workers())}
                job.series.append(job.last)
                self.migrations.control(job, rate_in, rate_out)
                if job.tracker.suspects and not job.life.migrating:
                    self.link.background(self.migrations.check_idle(job), f"idle check of job {job.id}")
                total_in += rate_in
                total_out += rate_out
                expired = [x for x in job.waiters if x[2] <= now]
                why = (scheduler.busy(self.queries.condition(job)) or self.sinks.unsettled(job)
                       or "has not heard from all its workers yet" if expired else None)
                for waiter in expired:
                    job.waiters.remove(waiter)
                    self.link.reply_error(waiter[0], waiter[1], RequestError(f"timeout: job {job.id} {why}"))
            self.last_rates = {"input_rate": total_in, "throughput": total_out}
            self.elastic.tick()

    def job_stats(self, job: PlannerJob, counters: dict | None = None) -> dict:
        """Throughput, input rate, latency, and the Table 2 metrics of every worker, for one job
        (`scheduler.job_stats`; `counters`: worker -> its exact cumulative counters)."""
        return {**scheduler.job_stats(job, self.workers, len(self.live_workers()), counters),
                "queue_bound": {"records": self.bound.max_records, "bytes": self.bound.max_bytes,
                                "max_delay": self.bound.max_delay, "limit": job.limit,
                                "drain_bytes_per_s": job.drain},
                "checkpoints": self.checkpoints.stats(job), "sinks": self.sinks.stats(job),
                "sources": self.sources.stats(job), "event_time": self.time.stats(job)}
