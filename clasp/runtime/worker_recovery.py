"""The worker's side of checkpoints and recovery (clasp.core.checkpoint): barriers, snapshots, restores.

Mixed into `clasp.runtime.worker.Worker`, which routes the control messages `ckpt_begin`, `ckpt_snapshot`,
`ckpt_abort` and `restore` here.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from time import perf_counter, thread_time

from clasp.core import protocol
from clasp.core.checkpoint import groups_to_restore
from clasp.core.dag import DagSpec
from clasp.core.routing import Placement
from clasp.runtime.engine import JobEngine
from clasp.runtime.operators import OperatorError, check_serializable
from clasp.runtime.state_store import CorruptCheckpoint, FileStore, wrap_blob

log = logging.getLogger("clasp.worker")
SNAPSHOT_SLICE_KEYS = 1000  # keys packed between two turns of the event loop (a slice ≈ 0.5 ms; at most one group)


class RecoveryMixin:
    state_dir: str | None

    def _store(self, planner_dir: str) -> FileStore:
        return FileStore(self.state_dir or planner_dir)

    def _on_ckpt_begin(self, body) -> bytes:
        eng = self._engine(body)
        eng.begin_barrier(body["boundary"])
        self._sinks_fence(eng, body["boundary"])
        # The positions of the cut: every batch read so far has a chunk below the boundary, every later one
        # will have one at or above it.
        positions = self._sources_barrier(eng.job, body["boundary"])
        return protocol.reply(body["req"], {"worker": self.id, "positions": positions})

    def _on_ckpt_abort(self, body) -> bytes:
        eng = self.jobs.get(body["job"])
        if eng is not None:
            eng.release_barrier()
            self._sinks_unfence(eng)
            self.wake.set()
        return protocol.reply(body["req"], True)

    def _on_ckpt_snapshot(self, body) -> None:
        eng = self._engine(body)
        self.tasks.spawn(self._snapshot(eng, body), f"checkpoint {body['ckpt']} of job {eng.job}")

    async def _snapshot(self, eng: JobEngine, body: dict) -> None:
        try:
            await self._snapshot_inner(eng, body)
        except Exception as e:  # the checkpoint fails (answered), the job goes on
            eng.release_barrier()
            self._sinks_unfence(eng)
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
            log.error("job %d checkpoint %d failed: %s", eng.job, body["ckpt"], text)
            self.dealer.send(protocol.reply_error(body["req"], f"checkpoint {body['ckpt']} failed: {text}"[:500]))

    async def _snapshot_inner(self, eng: JobEngine, body: dict) -> None:
        """Every record below the boundary is complete, and every key group a request above it changed has
        its image from before: pack the owned groups as of the boundary (in slices, yielding in between,
        the barrier still up while requests above it run on), release the barrier, then write the files off
        the event loop and answer."""
        req, job, ckpt = body["req"], body["job"], body["ckpt"]
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
                blobs.append((op, g, blob))
                keys += n
                if keys >= SNAPSHOT_SLICE_KEYS:
                    pause, pause_cpu = max(pause, perf_counter() - t), max(pause_cpu, thread_time() - tc)
                    keys = 0
                    await asyncio.sleep(0)
                    t, tc = perf_counter(), thread_time()
            collected = eng.cut.take_collected_below(body["boundary"])
            pause, pause_cpu = max(pause, perf_counter() - t), max(pause_cpu, thread_time() - tc)
        finally:
            if gc_was:
                gc.enable()
            released = eng.release_barrier()
            self.wake.set()
        pack_s = perf_counter() - t0
        store = self._store(body["dir"])
        try:
            nbytes = await asyncio.to_thread(_write_all, store, job, ckpt, self.id, blobs)
        except OSError as e:
            log.error("job %d checkpoint %d: writing the state failed: %s", job, ckpt, e)
            self.monitor.checkpoint_failures += 1
            self.dealer.send(protocol.reply_error(req, f"checkpoint {ckpt} not written: {e}"))
            self._sinks_unfence(eng)
            # the outputs go back: the checkpoint that would have released them failed
            for name, outs in collected.items():
                op = eng.op(name)
                op.collected[:0] = outs
                op.collected_rids[:0] = [body["boundary"] - 1] * len(outs)
            return
        # The sinks' writes below the boundary, prepared: committed when the checkpoint completes.
        sinks = await self._sinks_prepare(eng, ckpt, body["boundary"])
        groups: dict[str, list[int]] = {}
        for op, g, _ in blobs:
            groups.setdefault(op, []).append(g)
        self.dealer.send(protocol.reply(req, {
            "worker": self.id, "groups": groups, "bytes": nbytes, "collected": collected, "sinks": sinks,
            "pause": pause, "pause_cpu": pause_cpu, "pack_s": pack_s, "total_s": perf_counter() - t0,
            "released": released}))

    async def _on_restore(self, body) -> bytes:
        """Roll the job back: a fresh engine on the recovery placement, the key groups this worker owns
        loaded from checkpoint `ckpt` (0: the job's start, empty), every request of the old era dropped."""
        job = body["job"]
        old = self.jobs.pop(job, None)
        await self._sources_detach(job)
        spec = old.spec if old is not None else DagSpec.unpack(body["dag"])
        sinks = body.get("sinks") or {}
        sink_failed = await self._sinks_recover(job, sinks.get(self.id, {}), spec)
        placement = Placement.from_wire(body["placement"], spec)
        self._connect_peers(body["peers"])
        eng = JobEngine(job, spec, self.id, placement, self.p_max)
        self._time_restored(spec, body.get("watermark"))
        eng.outbox.max_batch = self.max_batch
        eng.executor.stall = self.stall
        eng.executor.on_work = self.wake.set
        eng.floor = placement.epoch
        if body.get("state") == "remote":
            eng.executor.remote_state = self._remote_state(body["state_server"])
        loaded = 0
        if body["ckpt"]:
            store = self._store(body["dir"])
            mine = groups_to_restore(spec, placement, self.id, body["groups"])
            try:
                parts = await asyncio.to_thread(store.read_groups, job, body["ckpt"], mine)
            except CorruptCheckpoint as e:
                log.error("job %d: %s", job, e)
                # An answer, not a failure: the planner falls back to the checkpoint before this one.
                return protocol.reply(body["req"], {"worker": self.id, "unreadable": str(e)})
            for op, g, items in parts:
                eng.install_group(op, g, items)
                loaded += len(items)
        self.jobs[job] = eng
        self._sinks_attach(eng, body.get("run", ""))
        self._sources_attach(eng, body.get("sources"))
        self.wake.set()
        log.info("job %d restored from checkpoint %d at epoch %d: %d keys", job, body["ckpt"], placement.epoch,
                 loaded)
        return protocol.reply(body["req"], {"worker": self.id, "keys": loaded, "sink_failed": sink_failed})


def _write_all(store: FileStore, job: int, ckpt: int, worker: str, blobs: list) -> int:
    """Write the snapshot's group blobs (msgpack) as this worker's one file, compressed here in the writer
    thread, off the loop."""
    return store.write_snapshot(job, ckpt, worker, ((op, g, wrap_blob(blob)) for op, g, blob in blobs))
