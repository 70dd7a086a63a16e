"""The worker's side of checkpoints and recovery (clasp.core.checkpoint): barriers, snapshots, restores.

`WorkerCheckpoints` is the worker's collaborator for them: the worker routes the control messages
`ckpt_begin`, `ckpt_snapshot`, `ckpt_abort` and `restore` to it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from time import perf_counter, thread_time

import msgpack

from clasp.core import protocol
from clasp.core.checkpoint import groups_to_restore
from clasp.core.dag import DagSpec
from clasp.core.routing import Placement
from clasp.runtime.engine import JobEngine
from clasp.runtime.monitor import Monitor
from clasp.runtime.operators import OperatorError, check_serializable
from clasp.runtime.sinks import WorkerSinks
from clasp.runtime.state_store import CorruptCheckpoint, FileStore, wrap_blob
from clasp.runtime.tasks import ProcessTasks
from clasp.runtime.worker_sources import WorkerSources
from clasp.runtime.worker_time import WorkerTime

log = logging.getLogger("clasp.worker")
SNAPSHOT_SLICE_KEYS = 1000  # keys packed between two turns of the event loop (a slice ≈ 0.5 ms; at most one group)


class WorkerCheckpoints:
    """The worker's checkpoints and restores of its jobs (`jobs`, the worker's table of engines). `state_dir`:
    where checkpoints go (None: the directory the planner names); `send` sends on the control channel (the
    answers that come later); `engine_of(msg)` finds a request's engine (or raises); `new_engine(msg, spec,
    placement)` makes a job's engine as a deploy does; `connect_peers(peers)` connects to a job's workers;
    `sinks`, `sources` and `time` are the worker's other collaborators a checkpoint and a restore involve."""

    def __init__(self, me: str, jobs: dict[int, JobEngine], tasks: ProcessTasks, monitor: Monitor, *,
                 state_dir: str | None, send: Callable[[bytes], object],
                 engine_of: Callable[[protocol.JobCall], JobEngine],
                 new_engine: Callable[[protocol.Deploy | protocol.Restore, DagSpec, Placement], JobEngine],
                 connect_peers: Callable[[dict], None], sinks: WorkerSinks, sources: WorkerSources, time: WorkerTime,
                 wake: asyncio.Event):
        self.me, self.jobs, self.tasks, self.monitor, self.state_dir = me, jobs, tasks, monitor, state_dir
        self.send, self.engine_of, self.new_engine, self.connect_peers = send, engine_of, new_engine, connect_peers
        self.sinks, self.sources, self.time, self.wake = sinks, sources, time, wake

    def _store(self, planner_dir: str) -> FileStore:
        return FileStore(self.state_dir or planner_dir)

    def on_begin(self, msg: protocol.CkptBegin) -> bytes:
        eng = self.engine_of(msg)
        eng.begin_barrier(msg.boundary)
        self.sinks.fence(eng, msg.boundary)
        # The positions of the cut: every batch read so far has a chunk below the boundary, every later one
        # will have one at or above it.
        positions = self.sources.barrier(eng.job, msg.boundary)
        return protocol.reply(msg.req, {"worker": self.me, "positions": positions})

    def on_abort(self, msg: protocol.CkptAbort) -> bytes:
        eng = self.jobs.get(msg.job)
        if eng is not None:
            eng.release_barrier()
            self.sinks.unfence(eng)
            self.wake.set()
        return protocol.reply(msg.req, True)

    def on_snapshot(self, msg: protocol.CkptSnapshot) -> None:
        eng = self.engine_of(msg)
        self.tasks.spawn(self._snapshot(eng, msg), f"checkpoint {msg.ckpt} of job {eng.job}")

    async def _snapshot(self, eng: JobEngine, msg: protocol.CkptSnapshot) -> None:
        try:
            await self._snapshot_inner(eng, msg)
        except Exception as e:  # the checkpoint fails (answered), the job goes on
            eng.release_barrier()
            self.sinks.unfence(eng)
            self.wake.set()
            self.monitor.checkpoint_failures += 1
            text = f"{type(e).__name__}: {e}"
            if isinstance(e, (TypeError, ValueError, OverflowError)):
                try:
                    for op in eng.ops:
                        if op.stateful:
                            check_serializable(op.name, op.state_dict())
                except OperatorError as named:
                    text = str(named)
            log.error("job %d checkpoint %d failed: %s", eng.job, msg.ckpt, text)
            self.send(protocol.reply_error(msg.req, f"checkpoint {msg.ckpt} failed: {text}"[:500]))

    async def _snapshot_inner(self, eng: JobEngine, msg: protocol.CkptSnapshot) -> None:
        """Every record below the boundary is complete, and every key group a request above it changed has
        its image from before: pack the owned groups as of the boundary (in slices, yielding in between,
        the barrier still up while requests above it run on), release the barrier, then write the files off
        the event loop and answer."""
        req, job, ckpt = msg.req, msg.job, msg.ckpt
        t0 = perf_counter()
        pause = pause_cpu = 0.0  # the longest slice, wall clock and this thread's CPU time
        blobs = []
        gc_was = False
        try:
            if eng.executor.async_tasks:
                await asyncio.gather(*list(eng.executor.async_tasks), return_exceptions=True)
            t, tc = perf_counter(), thread_time()
            keys = 0
            # A full collection over millions of state objects would land in one slice (tens of ms):
            # the packing makes many short-lived dicts, so collection waits until the barrier is down.
            gc_was = gc.isenabled()
            gc.disable()
            for op, g, n, blob in eng.cut.snapshot_groups(eng.placement):
                blobs.append((op, g, wrap_blob(blob)))
                keys += n
                if keys >= SNAPSHOT_SLICE_KEYS:
                    pause, pause_cpu = max(pause, perf_counter() - t), max(pause_cpu, thread_time() - tc)
                    keys = 0
                    await asyncio.sleep(0)
                    t, tc = perf_counter(), thread_time()
            collected = eng.cut.take_collected_below(msg.boundary)
            pause, pause_cpu = max(pause, perf_counter() - t), max(pause_cpu, thread_time() - tc)
        finally:
            if gc_was:
                gc.enable()
            cow_s = eng.cut.cow_s
            released = eng.release_barrier()
            self.wake.set()
        pack_s = perf_counter() - t0
        store = self._store(msg.dir)
        t_write = perf_counter()
        try:
            nbytes = await asyncio.to_thread(store.write_snapshot, job, ckpt, self.me, blobs)
        except Exception as e:  # a full disk, or anything else: the outputs taken above must not be lost
            log.error("job %d checkpoint %d: writing the state failed: %s: %s", job, ckpt, type(e).__name__, e)
            self.monitor.checkpoint_failures += 1
            self.send(protocol.reply_error(req, f"checkpoint {ckpt} not written: {e}"))
            self.sinks.unfence(eng)
            # the outputs go back: the checkpoint that would have released them failed
            for name, outs in collected.items():
                op = eng.op(name)
                op.collected[:0] = outs
                op.collected_rids[:0] = [msg.boundary - 1] * len(outs)
            return
        t_prepare = perf_counter()
        # The sinks' writes below the boundary, prepared: committed when the checkpoint completes.
        sinks = await self.sinks.prepare(eng, ckpt, msg.boundary)
        groups: dict[str, list[int]] = {}
        for op, g, _ in blobs:
            groups.setdefault(op, []).append(g)
        # Each operator's outputs as one packed array: the planner writes and answers them without decoding.
        packed = {name: msgpack.packb(outs, use_bin_type=True) for name, outs in collected.items()}
        self.send(protocol.reply(req, {
            "worker": self.me, "groups": groups, "bytes": nbytes, "collected": packed, "sinks": sinks,
            "pause": pause, "pause_cpu": pause_cpu, "pack_s": pack_s, "write_s": t_prepare - t_write,
            "prepare_s": perf_counter() - t_prepare, "cow_s": cow_s,
            "total_s": perf_counter() - t0, "released": released}))

    async def on_restore(self, msg: protocol.Restore) -> bytes:
        """Roll the job back: a fresh engine on the recovery placement, the key groups this worker owns
        loaded from checkpoint `ckpt` (0: the job's start, empty), every request of the old era dropped."""
        job = msg.job
        t0 = perf_counter()
        old = self.jobs.pop(job, None)
        await self.sources.detach(job)
        t_detached = perf_counter()
        spec = old.spec if old is not None else DagSpec.unpack(msg.dag)
        sink_failed = await self.sinks.recover(job, (msg.sinks or {}).get(self.me, {}), spec)
        t_sinks = perf_counter()
        placement = Placement.from_wire(msg.placement, spec)
        self.connect_peers(msg.peers)
        eng = self.new_engine(msg, spec, placement)
        self.time.restored(spec, msg.watermark)
        eng.floor = placement.epoch
        loaded = 0
        if msg.ckpt:
            store = self._store(msg.dir)
            mine = groups_to_restore(spec, placement, self.me, msg.groups)
            try:
                parts = await asyncio.to_thread(store.read_groups, job, msg.ckpt, mine)
            except CorruptCheckpoint as e:
                log.error("job %d: %s", job, e)
                # An answer, not a failure: the planner falls back to the checkpoint before this one.
                return protocol.reply(msg.req, {"worker": self.me, "unreadable": str(e)})
            for op, g, items in parts:
                eng.install_group(op, g, items)
                loaded += len(items)
        self.jobs[job] = eng
        self.sinks.attach(eng, msg.run or "")
        self.sources.attach(eng, msg.sources)
        self.wake.set()
        # The steps' times: a restore answers only once its sinks' commits owed are made (a slow one showed here).
        log.info("job %d restored from checkpoint %d at epoch %d: %d keys (readers closed in %.0f ms, sinks in "
                 "%.0f ms, %.0f ms in all)", job, msg.ckpt, placement.epoch, loaded, (t_detached - t0) * 1e3,
                 (t_sinks - t_detached) * 1e3, (perf_counter() - t0) * 1e3)
        return protocol.reply(msg.req, {"worker": self.me, "keys": loaded, "sink_failed": sink_failed})

