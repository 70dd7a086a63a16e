"""The worker process: sockets, registration and heartbeats around the engines of its jobs.

Sockets: a DEALER to the planner (control, heartbeats, progress counts); a PULL bound for data from the
planner and from peers; a PUSH per peer it sends to; a ROUTER bound as its state server, which any
process may ask for a key's state or a whole operator's. Metrics are served over HTTP.

`Worker` keeps the sockets, registration, heartbeats, the data path and the executor loop; its collaborators
are built in `__init__` with what they use passed in: `StateChannel` (clasp.runtime.worker_state: the state
server's answers, on both channels), `Migrator` (clasp.runtime.worker_migration: the worker's half of a
migration), `WorkerSinks` (clasp.runtime.sinks), `WorkerSources` (clasp.runtime.worker_sources: declared
sources), `WorkerTime` (clasp.runtime.worker_time: event time and timers) and `WorkerCheckpoints`
(clasp.runtime.worker_recovery: checkpoints and restores).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import time
import uuid
from time import perf_counter, thread_time

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from clasp.core import protocol
from clasp.core.dag import DagError, DagSpec
from clasp.core.estimator import stall_threshold
from clasp.core.protocol import ProtocolError
from clasp.core.rest import REST_IDLE_S, RestBudget, idle_work_at
from clasp.core.routing import Placement, PlacementError
from clasp.core.scheduler import PROGRESS_MAX_INTERVAL_S, progress_due
from clasp.runtime.config import WorkerConfig
from clasp.runtime.cpuquota import process_cpu_max
from clasp.runtime.engine import JobEngine
from clasp.runtime.monitor import Monitor, WorkerCollector
from clasp.runtime.net import (
    DirectSend,
    ServerLoop,
    advertised,
    batch_io_threads,
    bind,
    drained,
    start_metrics_server,
    zero_copy,
)
from clasp.runtime.operators import OperatorError
from clasp.runtime.remote_state import RemoteState
from clasp.runtime.security import Security
from clasp.runtime.sinks import WorkerSinks
from clasp.runtime.tasks import ProcessTasks, internal_error
from clasp.runtime.worker_migration import Migrator
from clasp.runtime.worker_recovery import WorkerCheckpoints
from clasp.runtime.worker_sources import WorkerSources
from clasp.runtime.worker_state import StateChannel
from clasp.runtime.worker_time import WorkerTime

log = logging.getLogger("clasp.worker")
# Errors whose text is meant for the asker; any other exception in a handler is a bug (an error id, logged).
CLIENT_ERRORS = (OperatorError, DagError, PlacementError, ProtocolError)
# While busy, a worker reports its progress counts at most this often: each `done` message costs the planner
# a wake-up, a decode and a look at its window (~40-100 µs), and at 5 ms two busy workers sent ~600 of them
# per 200,000 Word Count lines, most of the planner's cost per line after the records' own decoding.
# Epochs complete at most this much later under load (their latency percentiles include it).
PROGRESS_INTERVAL_S = 0.025
# ... and only once its push roots finished enough requests (`scheduler.progress_due`).
# A worker that runs out of work reports at once (`wait_idle` and the planner's in-flight window wait for
# it), unless it reported less than this long ago: then when this much has passed, if it is still idle by
# then (a worker that goes dry for a moment between its peers' batches reported 2-3 times per dispatch).
PROGRESS_IDLE_GAP_S = 0.002


class Worker:
    """One worker process. `await Worker(...).serve()` runs until cancelled."""

    def __init__(self, config: WorkerConfig, *, security: Security | None = None):
        """`config`: every setting `clasp worker` has a flag for; `security`: the CURVE keys (default: none)."""
        self.config = config
        self.planner_addr = config.planner
        self.busy_at = perf_counter()  # when this worker last did work (rounds, migrations): idle-time work waits
        self.host = config.host
        self.metrics_host = config.metrics_host or config.host
        self.security = security or Security()
        self.advertise = advertised(config.host, config.advertise)
        self.id = config.worker_id or f"w-{uuid.uuid4().hex[:8]}"
        self.p_max = config.p_max
        self.heartbeat = config.heartbeat
        self.flush_delay = config.flush_delay
        self.max_batch = config.max_batch
        self.strings = protocol.string_table()  # the strings received from peers (`protocol.open_columns`)
        self.stall = math.inf  # Executor.stall: set from this process's CPU quota
        self.ctx = batch_io_threads(zmq.asyncio.Context())
        self.monitor = Monitor(self.id)
        self.monitor.cpus = config.cpus
        self.jobs = self.monitor.jobs
        self.peers: dict[str, DirectSend] = {}
        self.peer_addrs: dict[str, str] = {}
        self.wake = asyncio.Event()
        self.welcomed = asyncio.Event()
        self._ports = (config.data_port, config.state_port, config.metrics_port)
        self._progress_since: float | None = None  # when progress began to gather, while busy
        self._progress_sent = 0.0  # when this worker last reported its progress
        self.remote_states: dict[str, RemoteState] = {}  # state-server endpoint -> its client (remote state)
        self.tasks = ProcessTasks(log)  # every task of this process; cancelled together when serve() ends
        self.leave_timeout = config.leave_timeout  # after SIGTERM: longest wait for the planner's drain, then exit 1
        self.exit_code: int | None = None  # set when the planner's `shutdown` (or a failed drain) ends serve()
        self._leaving = False
        self._main: asyncio.Task | None = None
        send = self._send_control
        # The time collaborator is made below: its timers are asked for at request time.
        self.state_channel = StateChannel(self._engine, self.monitor, lambda job: self.time.pending_timer(job))
        self.migrations = Migrator(self.id, self.jobs, self.tasks, engine_of=self._engine, peer=self._peer,
                                   flush_data=self._flush_data, send=send, bad=self._bad,
                                   busy=functools.partial(setattr, self, "busy_at"), wake=self.wake)
        self.sinks = WorkerSinks(self.id, self.tasks, send=send, engine_of=self._engine, wake=self.wake.set,
                                 error_text=self._error_text)
        readers: dict = {}  # job -> its source readers here (clasp/runtime/sources.py)
        self.time = WorkerTime(self.jobs, readers, self.tasks, send=send, wake=self.wake)
        self.sources = WorkerSources(self.id, readers, self.tasks, send=send, wake=self.wake.set,
                                     window=config.source_window, attached=self.time.attached)
        self.checkpoints = WorkerCheckpoints(
            self.id, self.jobs, self.tasks, self.monitor, state_dir=config.state_dir, send=send,
            engine_of=self._engine, new_engine=self._new_engine, connect_peers=self._connect_peers, sinks=self.sinks,
            sources=self.sources, time=self.time, wake=self.wake)

    # ----------------------------------------------------------------- lifecycle
    async def serve(self) -> None:
        data_port, state_port, metrics_port = self._ports
        sec = self.security
        sec.start_zap(self.ctx)
        self.pull = sec.server(self.ctx.socket(zmq.PULL), "worker_data")
        self.pull.setsockopt(zmq.RCVHWM, 0)
        self.data_endpoint = f"tcp://{self.advertise}:{bind(self.pull, self.host, data_port)}"
        self.router = sec.server(self.ctx.socket(zmq.ROUTER), "worker_state")
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.state_endpoint = f"tcp://{self.advertise}:{bind(self.router, self.host, state_port)}"
        self.dealer = zero_copy(sec.peer(self.ctx.socket(zmq.DEALER), "worker_control"))
        self.dealer.setsockopt(zmq.IDENTITY, self.id.encode())
        self.dealer.setsockopt(zmq.SNDHWM, 0)
        self.dealer.setsockopt(zmq.LINGER, 1000)
        self.dealer.connect(self.planner_addr)
        registry = CollectorRegistry()
        registry.register(WorkerCollector(self.monitor))
        registry.register(sec.collector())
        self.metrics_url = start_metrics_server(registry, self.metrics_host, metrics_port,
                                                self.advertise if self.metrics_host == self.host
                                                else advertised(self.metrics_host, None), ready=self.welcomed.is_set)
        print(f"clasp worker {self.id} data={self.data_endpoint} state={self.state_endpoint} "
              f"metrics={self.metrics_url} planner={self.planner_addr}", flush=True)
        self._main = asyncio.current_task()
        try:
            # The job engines' operator tasks are theirs (Executor.async_tasks); they end with the rest.
            state = self.state_channel.serve(self.router, on_bad=functools.partial(self._bad, where="state"),
                                             on_failure=self._failed)
            await self.tasks.run(self._control_loop(), self._data_loop(), state, self._executor_loop(),
                                 self._heartbeat_loop(), self._register_loop(), sec.run(),
                                 also=lambda: [t for e in self.jobs.values() for t in e.executor.async_tasks])
        except asyncio.CancelledError:
            if self.exit_code is None:
                raise
            return self.exit_code
        finally:
            self.ctx.destroy(linger=200)

    def _send_control(self, frame: bytes):
        """Send on the control channel (the planner's DEALER, made when the worker serves)."""
        return self.dealer.send(frame)

    async def _register_loop(self) -> None:
        while True:
            if not self.welcomed.is_set() and self.exit_code is None and not self._leaving:
                await self.dealer.send(protocol.pack(protocol.Register(
                    self.id, self.advertise, self.data_endpoint, self.state_endpoint, self.metrics_url, self.p_max,
                    os.getpid())))
            try:
                await asyncio.wait_for(self._wait_unwelcomed(), timeout=2.0)
            except TimeoutError:
                pass

    async def _wait_unwelcomed(self) -> None:
        await self.welcomed.wait()
        while self.welcomed.is_set():
            await asyncio.sleep(0.5)

    def _error_text(self, what: str, e: BaseException) -> str:
        """What the asker is told of a failed request: the error when it is about the request (an
        operator's failure, a bad DAG or placement), else an error id, the traceback logged under it."""
        if isinstance(e, CLIENT_ERRORS):
            return f"{type(e).__name__}: {e}"
        return internal_error(log, f"handling {what}", e, f"the log of worker {self.id}")

    def _bad(self, e: ProtocolError, where: str) -> None:
        self.monitor.bad_messages[e.reason] += 1
        log.warning("dropped a bad message on %s: %s", where, e)

    # ----------------------------------------------------------------- control channel (planner)
    async def _control_loop(self) -> None:
        ckpts, sinks, sources = self.checkpoints, self.sinks, self.sources
        handlers = {**self.state_channel.handlers, "welcome": self._on_welcome, "deploy": self._on_deploy,
                    "stop_job": self._on_stop_job, "error": self._on_error, "migrate_plan": self.migrations.on_plan,
                    "peers": self._on_peers, "shutdown": self._on_shutdown,
                    "ckpt_begin": ckpts.on_begin, "ckpt_snapshot": ckpts.on_snapshot, "ckpt_abort": ckpts.on_abort,
                    "restore": ckpts.on_restore, "sink_commit": sinks.on_commit, "sink_flush": sinks.on_flush,
                    "leased": sources.on_leased, "credit": sources.on_credit, "src_assign": sources.on_assign,
                    "src_release": sources.on_release, "watermark": self.time.on_watermark}
        await ServerLoop(self.dealer, handlers, where="a worker's control channel", routed=False,
                         on_bad=functools.partial(self._bad, where="control"), on_failure=self._failed,
                         decode=protocol.decode_message, answer_requests=True).serve()

    def _failed(self, ident: bytes | None, mtype: str, msg: protocol.Message, e: Exception) -> bytes | None:
        text = self._error_text(mtype if ident is None else f"state server: {mtype}", e)
        if isinstance(msg, protocol.Call):
            return protocol.reply_error(msg.req, text)
        return None

    def _on_welcome(self, msg: protocol.Welcome) -> None:
        self.heartbeat = float(msg.heartbeat) or self.heartbeat
        self.welcomed.set()
        log.info("registered with planner %s", msg.planner)

    def _on_error(self, msg: protocol.Error) -> None:
        if msg.reason == "unknown_worker":
            self.welcomed.clear()  # the planner restarted or declared us dead: register again
        elif msg.reason == "declared_dead":
            # We were silent too long: the planner recovered our jobs without us. Nothing here is current
            # any more; register again as a new worker holding nothing.
            for job in list(self.jobs):
                self.sinks.detach(job)
            self.jobs.clear()
            self.sources.drop_all()
            self.welcomed.clear()
        log.warning("planner reports %s: %s", msg.reason, msg.detail)

    # ----------------------------------------------------------------- joining and leaving (docs/DEPLOY.md)
    def _on_peers(self, msg: protocol.Peers) -> bytes:
        """Workers that joined a job's pool: connect to them now (a first send must not wait for a handshake)."""
        self._connect_peers(msg.peers)
        return protocol.reply(msg.req, {"worker": self.id})

    def leave(self) -> None:
        """SIGTERM: ask the planner to drain this worker; it answers `shutdown` once nothing is left here.
        A second SIGTERM, or no answer within `leave_timeout`, exits at once (code 1)."""
        if self._leaving or not self.welcomed.is_set():
            log.warning("SIGTERM%s: exiting now", " again" if self._leaving else " before registering")
            self._exit(1 if self._leaving else 0)
            return
        self._leaving = True
        log.info("SIGTERM: asking the planner to drain this worker")
        self.tasks.spawn(self._leave(), "leaving")

    async def _leave(self) -> None:
        await self.dealer.send(protocol.pack(protocol.Leave(self.id)))
        await asyncio.sleep(self.leave_timeout)
        log.error("the planner did not drain this worker within %g s: exiting", self.leave_timeout)
        self._exit(1)

    async def _on_shutdown(self, msg: protocol.Shutdown) -> None:
        if msg.ok:
            log.info("drained: %s; exiting", msg.detail)
        else:
            log.error("the planner could not drain this worker: %s; exiting", msg.detail)
        for eng in self.jobs.values():  # what is batched leaves before the sockets close
            self._flush_data(eng)
            self._flush_progress(eng)
        await asyncio.sleep(0.05)
        self._exit(0 if msg.ok else 1)

    def _exit(self, code: int) -> None:
        self.exit_code = code
        self.welcomed.clear()
        if self._main is not None:
            self._main.cancel()

    def _on_deploy(self, msg: protocol.Deploy) -> bytes:
        spec = DagSpec.unpack(msg.dag)
        placement = Placement.from_wire(msg.placement, spec)
        self._connect_peers(msg.peers)
        job = msg.job
        if job in self.jobs:
            raise ValueError(f"job {job} is already deployed here")
        eng = self._new_engine(msg, spec, placement)
        eng.floor = msg.floor or 0  # rows of an older epoch belong to an era a recovery rolled back
        self.jobs[job] = eng
        self.sinks.attach(eng, msg.run or "")
        self.sources.attach(eng, msg.sources)
        log.info("deployed job %d (%s), %d operators, epoch %d", job, spec.name, len(spec.operators), placement.epoch)
        return protocol.reply(msg.req, {"worker": self.id})

    def _new_engine(self, msg: protocol.Deploy | protocol.Restore, spec: DagSpec, placement: Placement) -> JobEngine:
        """A job's engine here, as its deploy or restore says, with this worker's settings."""
        eng = JobEngine(msg.job, spec, self.id, placement, self.p_max)
        eng.outbox.max_batch = self.max_batch
        eng.executor.stall = self.stall
        eng.executor.on_work = self.wake.set
        if msg.state == "remote":
            eng.executor.remote_state = self._remote_state(msg.state_server)
        return eng

    def _connect_peers(self, peers: dict) -> None:
        for wid, addr in peers.items():
            wid, addr = str(wid), str(addr)
            if self.peer_addrs.get(wid) != addr and wid in self.peers:
                self.peers.pop(wid).close(linger=0)  # a restarted peer with the same id: new ports
            self.peer_addrs[wid] = addr
            if wid != self.id:
                # Connected now, not on the first send: a first send waits for the TCP and ZMTP handshakes,
                # long enough for a new owner's outputs, sent later on a ready socket, to overtake it.
                self._peer(wid)

    def _remote_state(self, endpoint: str) -> RemoteState:
        """The client of the planner's remote-state server at `endpoint`, one per endpoint."""
        rs = self.remote_states.get(endpoint)
        if rs is None:
            rs = RemoteState(self.ctx, endpoint, self.id, on_bad=lambda e: self._bad(e, "remote state"),
                             security=self.security)
            self.remote_states[endpoint] = rs
        return rs

    def _engine(self, msg: protocol.JobCall) -> JobEngine:
        eng = self.jobs.get(msg.job)
        if eng is None:
            raise OperatorError(f"no job {msg.job} on worker {self.id}")
        return eng

    async def _on_stop_job(self, msg: protocol.StopJob) -> bytes:
        self.jobs.pop(msg.job, None)
        await self.sinks.stop(msg.job)
        await self.sources.detach(msg.job)
        return protocol.reply(msg.req, True)

    # ----------------------------------------------------------------- data path
    async def _data_loop(self) -> None:
        recv, raw = self.pull.recv, zmq.Socket.shadow(self.pull.underlying)
        on_frame = self._on_data_frame
        while True:
            on_frame(await recv(copy=False))
            for frame in drained(raw):
                on_frame(frame)

    def _on_data_frame(self, frame: zmq.Frame) -> None:
        """One frame of the data socket: validated, then enqueued (or a migration step); a bad one counted."""
        job_messages = self.monitor.job_messages
        t0 = perf_counter()
        try:
            mtype, body = protocol.decode(frame.buffer)  # the frame's memory, not a copy of it
            if mtype not in ("cols", "data", "runs", "marker", "migrate"):
                raise ProtocolError("unexpected_type", f"{mtype} on the data socket")
            eng = self.jobs.get(body[0])
            if eng is None:
                raise ProtocolError("unknown_job", f"{mtype} for job {body[0]}")
            if mtype == "cols":
                protocol.open_columns(body[2], self.strings)
                protocol.check_columns(body[2], len(eng.ops))
            elif mtype == "data":
                protocol.check_rows(body[2], len(eng.ops))
            elif mtype == "runs":
                protocol.check_runs(body[2], len(eng.ops))
                failed = protocol.open_runs(body[2])  # pushed segments decoded here, not at the planner
                if failed:
                    self._bad(ProtocolError("undecodable", failed[0][3]), "data")
                    if body[1] >= eng.floor:
                        eng.drop_runs(failed)
            else:
                protocol.check_migrate(body, len(eng.ops))
                msg = protocol.parse(mtype, body)  # a marker or a migrate: once per migration step
        except ProtocolError as e:
            self._bad(e, "data")
            return
        if body[1] < eng.floor:
            return  # sent before a recovery rolled the job back: that era's requests are void
        if mtype == "cols":
            n = protocol.column_count(body[2])
            msgs = job_messages(body[0])
            msgs[2] += 1
            msgs[3] += n
            eng.received_requests += n
            eng.receive_columns(body[1], body[2])
            self.wake.set()
        elif mtype == "data":
            msgs = job_messages(body[0])
            msgs[2] += 1
            msgs[3] += len(body[2])
            eng.received_requests += len(body[2])
            eng.receive(body[1], body[2])
            self.wake.set()
        elif mtype == "runs":
            msgs = job_messages(body[0])
            msgs[2] += 1
            msgs[3] += eng.receive_runs(body[1], body[2])
            self.time.push_marks(eng, body[2])
            self.wake.set()
        else:
            self.migrations.on_message(eng, msg, perf_counter() - t0)

    def _peer(self, wid: str) -> DirectSend:
        peer = self.peers.get(wid)
        if peer is None:
            sock = zero_copy(self.security.peer(self.ctx.socket(zmq.PUSH)))
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(self.peer_addrs[wid])
            peer = self.peers[wid] = DirectSend(sock)
        return peer

    def _flush_data(self, eng: JobEngine) -> None:
        encode = protocol.encode_columns
        dests = self.monitor.destinations_interval
        msgs = self.monitor.job_messages(eng.job)
        for wid, (groups, n) in eng.take_batches().items():
            self._peer(wid).send(encode(eng.job, eng.epoch, groups), copy=False)
            dests.add(wid)
            msgs[0] += 1
            msgs[1] += n

    def _flush_progress(self, eng: JobEngine) -> None:
        if eng.executor.progress:
            self.dealer.send(protocol.encode("done", [eng.job, eng.take_progress(), eng.behind()]), copy=False)
            self._progress_sent = perf_counter()

    def _flush_progress_busy(self, overdue: bool) -> None:
        """Busy, an interval after progress began to gather: report the jobs whose push roots finished
        `scheduler.PROGRESS_MIN_ROOTS` requests here (every job once `overdue`, or that runs no push root here)."""
        held = False
        for eng in self.jobs.values():
            if not eng.executor.progress:
                continue
            if progress_due(overdue, eng.roots_finished()):
                self._flush_progress(eng)
            else:
                held = True
        if not held:
            self._progress_since = None

    def _flush_progress_idle(self, now: float) -> float | None:
        """Out of work: report every job's progress now, or, within PROGRESS_IDLE_GAP_S of the last report,
        return when to (the loop wakes then and, still idle, reports)."""
        due = self._progress_sent + PROGRESS_IDLE_GAP_S
        if now < due and any(eng.executor.progress for eng in self.jobs.values()):
            return due
        for eng in list(self.jobs.values()):
            self._flush_progress(eng)
        return None

    async def _executor_loop(self) -> None:
        flush_delay = self.flush_delay
        progress_every = max(flush_delay, PROGRESS_INTERVAL_S)
        sleep = asyncio.sleep
        budget = RestBudget(perf_counter())
        timer = None
        while True:
            done = 0
            now = perf_counter()
            for eng in list(self.jobs.values()):
                done += eng.run_round()
                out = eng.outbox
                if out.pending or out.pending_cols:
                    now = perf_counter()
                    if now - out.pending_since >= flush_delay or out.batch_full():
                        self._flush_data(eng)
            if done:
                self.busy_at = now
                for eng in self.jobs.values():  # a worker that stays busy frees moved state too, a group a round
                    if eng.handover.dropped and eng.handover.migration is None:
                        eng.handover.free_one()
                if self._progress_since is None:
                    self._progress_since = now
                elif now - self._progress_since >= progress_every:
                    self._flush_progress_busy(now - self._progress_since >= PROGRESS_MAX_INTERVAL_S)
                await sleep(0)
                continue
            # Nothing runnable: send whatever is batched now, then wait for work.
            for eng in list(self.jobs.values()):
                if eng.outbox.waiting():
                    self._flush_data(eng)
            report_at = self._flush_progress_idle(perf_counter())
            self._progress_since = None
            # Idle-time work, one key group per step, once the worker has had nothing to do for REST_IDLE_S
            # (a migration counts as work: its messages, and the I/O thread under the same CPU quota, first).
            now = perf_counter()
            quiet = now - self.busy_at >= REST_IDLE_S
            engines = list(self.jobs.values())
            if quiet and any(e.handover.free_one() or e.warm_one() for e in engines):
                await sleep(0)  # one moved key group freed or one migrated group decoded, then look again
                continue
            if quiet and budget.allows(now):
                c = thread_time()
                if any(e.rest_one() for e in engines):
                    budget.spend(thread_time() - c)
                    await sleep(0)  # one changed key group put to rest, then look for work again
                    continue
            self.wake.clear()
            if any(any(o.queue for o in e.ops) and not any(o.busy for o in e.ops) for e in self.jobs.values()):
                continue
            if self.migrations.gc_paused:
                self.migrations.gc_for_migrations()
            if timer is not None:
                timer.cancel()
                timer = None
            moved = any(e.handover.dropped or any(o.cold for o in e.ops) for e in engines)
            at = idle_work_at(self.busy_at, now, moved, not moved and any(e.changed() for e in engines), budget)
            if report_at is not None:
                at = report_at if at is None else min(at, report_at)
            if at is not None:
                timer = asyncio.get_running_loop().call_later(max(0.0, at - now), self.wake.set)
            self.monitor.idle_waits += 1
            await self.wake.wait()

    # ----------------------------------------------------------------- heartbeats
    def _read_quota(self) -> None:
        """This process's CPU quota (it can be placed in a cgroup after it started): the monitor's CPU limit,
        and the engines' stall threshold, half of the longest throttled stretch of a period."""
        cpu_max = process_cpu_max()
        self.monitor.cpu_limit = None if cpu_max is None else cpu_max[0] / cpu_max[1]
        stall = stall_threshold(cpu_max)
        if stall != self.stall:
            log.info("CPU quota %s: timed executions over %.1f ms count as stalled", cpu_max, stall * 1e3)
            self.stall = stall
            for eng in self.jobs.values():
                eng.executor.stall = stall

    async def _heartbeat_loop(self) -> None:
        self._read_quota()
        await self.welcomed.wait()
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.heartbeat)
            now = time.monotonic()
            self._read_quota()
            sample = self.monitor.sample(now - last)
            last = now
            if self.welcomed.is_set():
                await self.dealer.send(protocol.pack(protocol.Heartbeat(self.id, sample)))
