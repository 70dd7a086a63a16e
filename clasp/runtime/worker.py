"""The worker process: sockets, registration and heartbeats around the engines of its jobs.

Sockets: a DEALER to the planner (control, heartbeats, progress counts); a PULL bound for data from the
planner and from peers; a PUSH per peer it sends to; a ROUTER bound as its state server, which any
process may ask for a key's state or a whole operator's. Metrics are served over HTTP.
"""

from __future__ import annotations

import asyncio
import functools
import gc
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
from clasp.core.migration import MigrationPlan, WorkerMigration
from clasp.core.protocol import ProtocolError
from clasp.core.rest import REST_IDLE_S, RestBudget
from clasp.core.routing import Placement, PlacementError
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
from clasp.runtime.sinks import SinkMixin
from clasp.runtime.tasks import ProcessTasks, internal_error
from clasp.runtime.worker_recovery import RecoveryMixin
from clasp.runtime.worker_sources import SourcesMixin
from clasp.runtime.worker_time import TimeMixin

log = logging.getLogger("clasp.worker")
# Errors whose text is meant for the asker; any other exception in a handler is a bug (an error id, logged).
CLIENT_ERRORS = (OperatorError, DagError, PlacementError, ProtocolError)
# Seconds of migration work (taking out and serializing key groups) between two turns of the event loop.
# Short, because under a CPU quota a stretch that outlasts the period's allowance stalls for the rest of it.
MIGRATE_SLICE_S = 0.0005
# While busy, a worker reports its progress counts at most this often (and at once when it runs out of work):
# a `done` message costs the worker's asyncio DEALER and the planner ~30 µs each, and a 1 ms report took
# ~9 % of a busy worker's loop; epochs complete at most this much later under load.
PROGRESS_INTERVAL_S = 0.005
MIGRATE_SLICE_ROWS = 1000  # queued requests one migrate message carries at most (with their groups' state)
MIGRATE_SLICE_BYTES = 256 << 10  # and bytes of state, about: decoding it stays well under a millisecond


class Worker(RecoveryMixin, SinkMixin, SourcesMixin, TimeMixin):
    """One worker process. `await Worker(...).serve()` runs until cancelled."""

    def __init__(self, config: WorkerConfig, *, security: Security | None = None):
        """`config`: every setting `clasp worker` has a flag for; `security`: the CURVE keys (default: none)."""
        self.config = config
        self.planner_addr = config.planner
        self.state_dir = config.state_dir  # checkpoints; None: the directory the planner names
        self.checkpoint_failures = 0
        self.busy_at = perf_counter()  # when this worker last did work (rounds, migrations): idle-time work waits
        self._gc_paused = False  # collection turned off here for a migration in progress
        self.host = config.host
        self.metrics_host = config.metrics_host or config.host
        self.security = security or Security()
        self.advertise = advertised(config.host, config.advertise)
        self.id = config.worker_id or f"w-{uuid.uuid4().hex[:8]}"
        self.p_max = config.p_max
        self.heartbeat = config.heartbeat
        self.flush_delay = config.flush_delay
        self.max_batch = config.max_batch
        self.stall = math.inf  # JobEngine.stall: set from this process's CPU quota
        self.ctx = batch_io_threads(zmq.asyncio.Context())
        self.monitor = Monitor(self.id)
        self.monitor.cpus = config.cpus
        self.jobs = self.monitor.jobs
        self.peers: dict[str, DirectSend] = {}
        self.peer_addrs: dict[str, str] = {}
        self.wake = asyncio.Event()
        self.firing: set[int] = set()  # jobs whose windows are being fired (clasp.runtime.worker_time)
        self.welcomed = asyncio.Event()
        self._ports = (config.data_port, config.state_port, config.metrics_port)
        self._progress_since: float | None = None
        self.remote_states: dict[str, RemoteState] = {}  # state-server endpoint -> its client (remote state)
        self.sources = {}  # job -> its source readers here (clasp/runtime/sources.py)
        self.source_window = config.source_window
        self.tasks = ProcessTasks(log)  # every task of this process; cancelled together when serve() ends
        self.leave_timeout = config.leave_timeout  # after SIGTERM: longest wait for the planner's drain, then exit 1
        self.exit_code: int | None = None  # set when the planner's `shutdown` (or a failed drain) ends serve()
        self._leaving = False
        self._main: asyncio.Task | None = None

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
            # The job engines' operator tasks are theirs (JobEngine.async_tasks); they end with the rest.
            await self.tasks.run(self._control_loop(), self._data_loop(), self._state_loop(), self._executor_loop(),
                                 self._heartbeat_loop(), self._register_loop(), sec.run(),
                                 also=lambda: [t for e in self.jobs.values() for t in e.async_tasks])
        except asyncio.CancelledError:
            if self.exit_code is None:
                raise
            return self.exit_code
        finally:
            self.ctx.destroy(linger=200)

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
        handlers = {"welcome": self._on_welcome, "deploy": self._on_deploy,
                    "state_dump": self._on_state_dump, "collected_dump": self._on_collected_dump,
                    "stop_job": self._on_stop_job, "error": self._on_error, "state_get": self._on_state_get,
                    "state_put": self._on_state_put, "counters": self._on_counters,
                    "migrate_plan": self._on_migrate_plan, "peers": self._on_peers, "shutdown": self._on_shutdown,
                    "ckpt_begin": self._on_ckpt_begin, "ckpt_snapshot": self._on_ckpt_snapshot,
                    "ckpt_abort": self._on_ckpt_abort, "restore": self._on_restore,
                    "sink_commit": self._on_sink_commit, "sink_flush": self._on_sink_flush,
                    "leased": self._on_leased, "credit": self._on_credit, "src_assign": self._on_src_assign,
                    "src_release": self._on_src_release, "watermark": self._on_watermark}
        await ServerLoop(self.dealer, handlers, where="a worker's control channel", routed=False,
                         on_bad=functools.partial(self._bad, where="control"), on_failure=self._failed).serve()

    def _failed(self, ident: bytes | None, mtype: str, body, e: Exception) -> bytes | None:
        text = self._error_text(mtype if ident is None else f"state server: {mtype}", e)
        if isinstance(body, dict) and "req" in body:
            return protocol.reply_error(body["req"], text)
        return None

    def _on_welcome(self, body) -> None:
        self.heartbeat = float(body["heartbeat"]) or self.heartbeat
        self.welcomed.set()
        log.info("registered with planner %s", body["planner"])

    def _on_error(self, body) -> None:
        if body["reason"] == "unknown_worker":
            self.welcomed.clear()  # the planner restarted or declared us dead: register again
        elif body["reason"] == "declared_dead":
            # We were silent too long: the planner recovered our jobs without us. Nothing here is current
            # any more; register again as a new worker holding nothing.
            for job in list(self.jobs):
                self._sinks_detach(job)
            self.jobs.clear()
            self._sources_drop_all()
            self.welcomed.clear()
        log.warning("planner reports %s: %s", body["reason"], body["detail"])

    # ----------------------------------------------------------------- joining and leaving (docs/DEPLOY.md)
    def _on_peers(self, body) -> bytes:
        """Workers that joined a job's pool: connect to them now (a first send must not wait for a handshake)."""
        self._connect_peers(body["peers"])
        return protocol.reply(body["req"], {"worker": self.id})

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

    async def _on_shutdown(self, body) -> None:
        if body["ok"]:
            log.info("drained: %s; exiting", body["detail"])
        else:
            log.error("the planner could not drain this worker: %s; exiting", body["detail"])
        for eng in self.jobs.values():  # what is batched leaves before the sockets close
            self._flush_data(eng)
            self._flush_progress(eng)
        await asyncio.sleep(0.05)
        self._exit(0 if body["ok"] else 1)

    def _exit(self, code: int) -> None:
        self.exit_code = code
        self.welcomed.clear()
        if self._main is not None:
            self._main.cancel()

    def _on_deploy(self, body) -> bytes:
        spec = DagSpec.unpack(body["dag"])
        placement = Placement.from_wire(body["placement"], spec)
        self._connect_peers(body["peers"])
        job = body["job"]
        if job in self.jobs:
            raise ValueError(f"job {job} is already deployed here")
        eng = JobEngine(job, spec, self.id, placement, self.p_max)
        eng.outbox.max_batch = self.max_batch
        eng.stall = self.stall
        eng.on_work = self.wake.set
        if body.get("state") == "remote":
            eng.remote_state = self._remote_state(body["state_server"])
        eng.floor = body.get("floor") or 0  # rows of an older epoch belong to an era a recovery rolled back
        self.jobs[job] = eng
        self._sinks_attach(eng, body.get("run", ""))
        self._sources_attach(eng, body.get("sources"))
        log.info("deployed job %d (%s), %d operators, epoch %d", job, spec.name, len(spec.operators), placement.epoch)
        return protocol.reply(body["req"], {"worker": self.id})

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

    def _engine(self, body) -> JobEngine:
        eng = self.jobs.get(body["job"])
        if eng is None:
            raise OperatorError(f"no job {body['job']} on worker {self.id}")
        return eng

    def _on_state_dump(self, body) -> bytes:
        return protocol.reply(body["req"], self._engine(body).state_dump(body["op"]))

    def _on_collected_dump(self, body) -> bytes:
        return protocol.reply(body["req"], list(self._engine(body).op(body["op"]).collected))

    def _on_counters(self, body) -> bytes:
        eng = self._engine(body)
        out = {**eng.counters(), "messages": self.monitor.message_counts(eng.job)}
        if body.get("below") is not None:
            out["holds_below"] = eng.holds_below(body["below"])
        return protocol.reply(body["req"], out)

    def _on_state_get(self, body) -> bytes:
        op = self._engine(body).op(body["op"])
        op.warm_key(body["key"])
        return protocol.reply(body["req"], op.get(body["key"]))

    def _on_state_put(self, body) -> bytes:
        op = self._engine(body).op(body["op"])
        op.warm_key(body["key"])
        op.set_state(body["key"], body["value"])
        return protocol.reply(body["req"], True)

    # ----------------------------------------------------------------- migration (paper §4.4)
    def _on_migrate_plan(self, body) -> None:
        """Steps 3-7 for one plan; the reply to the planner is sent when this worker is done."""
        eng = self._engine(body)
        plan = MigrationPlan.from_wire(body["plan"])
        placement = Placement.from_wire(body["placement"], eng.spec)
        if placement.epoch <= eng.epoch:
            raise ValueError(f"plan for epoch {placement.epoch}, job {eng.job} is at {eng.epoch}")
        if eng.migration is not None:
            # The planner sends a newer plan while this one waits when a peer died: stop waiting for the
            # dead (their key groups restart empty), finish this one, then run the next.
            self._forget(eng, plan.dead)
            eng.queued_plans.append(body)
            self.tasks.spawn(self._progress(eng), f"migration of job {eng.job}")
            return
        eng.migration = WorkerMigration(plan, self.id)
        self._gc_for_migrations()
        eng.migration_req = body["req"]
        eng.migration_t0 = self.busy_at = perf_counter()
        eng.migration_stats = {"bytes": 0, "objects": 0, "rows": 0, "received_objects": 0, "busy_ms": 0.0,
                               "pause_ms": 0.0, "pause_cpu_ms": 0.0}
        # Step 3: what was batched under the old epoch leaves first, then the markers that close it.
        self._flush_data(eng)
        marker = protocol.encode("marker", [eng.job, placement.epoch, self.id])
        for wid in plan.markers_to_send(self.id):
            self._peer(wid).send(marker)
        index = {o.name: o.index for o in eng.spec.operators}
        incoming: dict[int, set[int]] = {}
        for op, moves in plan.moves.items():
            for (src, dst), groups in moves.items():
                if dst == self.id and src not in plan.dead:  # a dead worker's groups restart empty at once
                    incoming.setdefault(index[op], set()).update(groups)
        eng.begin_migration(placement, incoming)
        early, eng.early = eng.early, []
        for mtype, m in early:
            self._on_migration_message(eng, mtype, m)
        self.tasks.spawn(self._progress(eng), f"migration of job {eng.job}")

    def _groups_from(self, eng: JobEngine, sender: str) -> dict[int, list[int]]:
        """The key groups the current plan moves from `sender` to this worker, by operator index."""
        index = {o.name: o.index for o in eng.spec.operators}
        out: dict[int, list[int]] = {}
        for op, moves in eng.migration.plan.moves.items():
            groups = moves.get((sender, self.id))
            if groups:
                out[index[op]] = groups
        return out

    def _forget(self, eng: JobEngine, dead) -> None:
        mig = eng.migration
        for w in dead:
            if w in mig.awaiting_state:
                eng.release_groups(self._groups_from(eng, w))
        mig.forget(dead)

    def _on_migration_message(self, eng: JobEngine, mtype: str, body: list, decode_s: float = 0.0) -> None:
        """A marker or a migrate message (`decode_s`: the time its decoding took, part of the work)."""
        mig = eng.migration
        epoch, sender = body[1], body[2]
        if epoch > eng.epoch:
            eng.early.append((mtype, body))  # it overtook our plan
            return
        if mig is None or epoch < mig.plan.epoch:
            self._bad(ProtocolError("stale_migration", f"{mtype} for epoch {epoch} at epoch {eng.epoch}"), "data")
            return
        if mtype == "marker":
            mig.marker(sender)
        else:
            # Steps 5-6, group by group: install the state and requests that came, release what was held.
            t, tc = perf_counter(), thread_time()
            _, _, _, units, rows, more = body
            eng.migration_stats["received_objects"] += eng.install(units, rows)
            released: dict[int, list[int]] = {}
            for op_index, g, _blob, _keys, _rows in units:
                released.setdefault(op_index, []).append(g)
            if not more:  # the last message from this sender: groups it had nothing of are ours now too
                released = self._groups_from(eng, sender)
                mig.received(sender)
            eng.release_groups(released)
            self._slice(eng.migration_stats, t - decode_s, tc - decode_s)
            self.busy_at = perf_counter()
            self.wake.set()
        self.tasks.spawn(self._progress(eng), f"migration of job {eng.job}")

    async def _progress(self, eng: JobEngine) -> None:
        mig = eng.migration
        if mig is None:
            return
        if mig.ready_to_send:
            mig.start_sending()
            stats = eng.migration_stats
            stats["markers_ms"] = (perf_counter() - eng.migration_t0) * 1e3
            if eng.async_tasks:  # drain: let running executions finish before their state moves
                await asyncio.gather(*list(eng.async_tasks), return_exceptions=True)
            # What this worker's own executions batched goes first: a new owner must not run a moved
            # group, and send its outputs on, before the outputs this worker made of that group left.
            self._flush_data(eng)
            if not await self._send_state(eng, mig, stats):
                return  # a recovery replaced this engine: its migration is void
            stats["sent_ms"] = (perf_counter() - eng.migration_t0) * 1e3
            mig.finish_sending()
        if mig.done and eng.migration is mig:
            self._finish_migration(eng)

    async def _send_state(self, eng: JobEngine, mig: WorkerMigration, stats: dict) -> bool:
        """Step 4: what this worker loses, in slices; False if a recovery replaced the engine meanwhile.

        Whole key groups (at rest: as their blobs; else serialized as taken out), sent in slices of about
        MIGRATE_SLICE_S of work with a turn of the event loop in between: the worker keeps running everything
        else, no single step holds it long, and each receiver can release the groups of a slice (and run their
        requests) while later ones are still on their way."""
        epoch = mig.plan.epoch
        chunks: dict[str, list] = {}
        loose: dict[str, list] = {}
        packed_before = eng.packed_on_move
        chunk_rows = chunk_bytes = 0
        t, tc = perf_counter(), thread_time()
        for wid, unit, rows in eng.extract():
            if wid is None:
                pass  # a pause point of the queue scan
            elif wid in mig.plan.dead:
                continue
            elif unit is None:
                loose[wid] = rows
                stats["rows"] += len(rows)
                continue
            else:
                chunks.setdefault(wid, []).append(unit)
                stats["objects"] += unit[3]
                stats["rows"] += len(unit[4])
                chunk_rows += len(unit[4])
                chunk_bytes += len(unit[2])
            # A slice is encoded when it is sent, and decoded by its receiver in one step: groups at rest take no
            # time to gather but could carry megabytes or a whole backlog, so bytes and rows end a slice too.
            if (perf_counter() - t >= MIGRATE_SLICE_S or chunk_rows >= MIGRATE_SLICE_ROWS
                    or chunk_bytes >= MIGRATE_SLICE_BYTES):
                for peer, units in chunks.items():
                    self._send_migrate(eng, peer, epoch, units, [], True)
                chunks, chunk_rows, chunk_bytes = {}, 0, 0
                self._slice(stats, t, tc)
                await asyncio.sleep(0)
                t, tc = perf_counter(), thread_time()
                if self.jobs.get(eng.job) is not eng:
                    return False
        for peer, units in chunks.items():
            self._send_migrate(eng, peer, epoch, units, [], True)
        # Handed-over requests of stateless operators last, MIGRATE_SLICE_ROWS a message.
        for peer, rows in loose.items():
            pieces = [rows[i:i + MIGRATE_SLICE_ROWS] for i in range(0, len(rows), MIGRATE_SLICE_ROWS)] or [[]]
            for piece in pieces[:-1]:
                self._send_migrate(eng, peer, epoch, [], piece, True)
                self._slice(stats, t, tc)
                await asyncio.sleep(0)
                t, tc = perf_counter(), thread_time()
                if self.jobs.get(eng.job) is not eng:
                    return False
            loose[peer] = pieces[-1]
        for wid in set(mig.plan.sends_to.get(self.id, [])) - set(mig.plan.dead):
            self._send_migrate(eng, wid, epoch, [], loose.pop(wid, []), False)
        self._slice(stats, t, tc)
        stats["packed_groups"] = eng.packed_on_move - packed_before
        return True

    def _send_migrate(self, eng: JobEngine, wid: str, epoch: int, units: list, rows: list, more: bool) -> None:
        """Step 4's message to one peer; the last one carries `more=False`."""
        frame = protocol.encode("migrate", [eng.job, epoch, self.id, units, rows, more])
        self._peer(wid).send(frame, copy=False)
        eng.migration_stats["bytes"] += len(frame)

    @staticmethod
    def _slice(stats: dict, t0: float, c0: float) -> None:
        """Account one uninterrupted stretch of migration work: its total, and the longest (the pause), by
        the wall clock and by this thread's CPU time (the difference: preemption and CPU-quota throttling)."""
        ms = (perf_counter() - t0) * 1e3
        stats["busy_ms"] += ms
        stats["pause_ms"] = max(stats.get("pause_ms", 0.0), ms)
        stats["pause_cpu_ms"] = max(stats.get("pause_cpu_ms", 0.0), (thread_time() - c0) * 1e3)

    def _gc_for_migrations(self) -> None:
        """No cyclic garbage collection while a migration runs here (as in checkpoints): a full pass over the
        state's objects, tens of ms with millions of them, would land inside one of its slices. Also called
        when idle, so a migration that a recovery voided does not leave collection off."""
        busy = any(e.migration is not None for e in self.jobs.values())
        if busy and not self._gc_paused and gc.isenabled():
            gc.disable()
            self._gc_paused = True
        elif not busy and self._gc_paused:
            gc.enable()
            self._gc_paused = False

    def _finish_migration(self, eng: JobEngine) -> None:
        self.busy_at = perf_counter()
        hold = self.busy_at - eng.migration_t0
        stats = eng.migration_stats
        pause = stats.get("pause_ms", 0.0) / 1e3
        reply = {"worker": self.id, "epoch": eng.epoch, "pause": pause, "hold": hold, "group_hold": eng.group_hold,
                 **stats}
        self.dealer.send(protocol.reply(eng.migration_req, reply))
        eng.migration = None
        self._gc_for_migrations()
        self.wake.set()
        if eng.queued_plans and self.jobs.get(eng.job) is eng:
            self._on_migrate_plan(eng.queued_plans.pop(0))

    async def _on_stop_job(self, body) -> bytes:
        self.jobs.pop(body["job"], None)
        await self._sinks_stop(body["job"])
        await self._sources_detach(body["job"])
        return protocol.reply(body["req"], True)

    # ----------------------------------------------------------------- state server (any process)
    async def _state_loop(self) -> None:
        handlers = {"state_get": self._on_state_get, "state_put": self._on_state_put,
                    "state_dump": self._on_state_dump, "collected_dump": self._on_collected_dump,
                    "counters": self._on_counters}
        await ServerLoop(self.router, handlers, where="a state server", pass_ident=False,
                         on_bad=functools.partial(self._bad, where="state"), on_failure=self._failed).serve()

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
                protocol.check_columns(body[2], len(eng.ops))
            elif mtype == "data":
                protocol.check_rows(body[2], len(eng.ops))
            elif mtype == "runs":
                protocol.check_runs(body[2], len(eng.ops))
            else:
                protocol.check_migrate(body, len(eng.ops))
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
            self.wake.set()
        else:
            self._on_migration_message(eng, mtype, body, perf_counter() - t0)

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
        encode = protocol.encode
        dests = self.monitor.destinations_interval
        msgs = self.monitor.job_messages(eng.job)
        for wid, (groups, n) in eng.take_batches().items():
            self._peer(wid).send(encode("cols", [eng.job, eng.epoch, groups]), copy=False)
            dests.add(wid)
            msgs[0] += 1
            msgs[1] += n

    def _flush_progress(self, eng: JobEngine) -> None:
        if eng.progress:
            self.dealer.send(protocol.encode("done", [eng.job, eng.take_progress()]), copy=False)

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
                    if eng.dropped and eng.migration is None:
                        eng.free_one()
                if self._progress_since is None:
                    self._progress_since = now
                elif now - self._progress_since >= progress_every:
                    for eng in self.jobs.values():
                        self._flush_progress(eng)
                    self._progress_since = None
                await sleep(0)
                continue
            # Nothing runnable: send whatever is batched now, then wait for work.
            for eng in list(self.jobs.values()):
                if eng.outbox.waiting():
                    self._flush_data(eng)
                self._flush_progress(eng)
            self._progress_since = None
            # Idle-time work, one key group per step, once the worker has had nothing to do for REST_IDLE_S
            # (a migration counts as work: its messages, and the I/O thread under the same CPU quota, first).
            now = perf_counter()
            quiet = now - self.busy_at >= REST_IDLE_S
            engines = list(self.jobs.values())
            if quiet and any(e.free_one() or e.warm_one() for e in engines):
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
            if self._gc_paused:
                self._gc_for_migrations()
            if timer is not None:
                timer.cancel()
                timer = None
            at = None  # when idle-time work may start
            if any(e.dropped or any(o.cold for o in e.ops) for e in engines):
                at = self.busy_at + REST_IDLE_S
            elif any(e.changed() for e in engines):
                at = max(self.busy_at + REST_IDLE_S, budget.ready_at(now))
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
        stall = math.inf if cpu_max is None else max(1e-3, 0.5 * (cpu_max[1] - cpu_max[0]))
        if stall != self.stall:
            log.info("CPU quota %s: timed executions over %.1f ms count as stalled", cpu_max, stall * 1e3)
            self.stall = stall
            for eng in self.jobs.values():
                eng.stall = stall

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
