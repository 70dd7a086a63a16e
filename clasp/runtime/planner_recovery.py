"""The planner's checkpoint coordinator (clasp.core.checkpoint): checkpoints, rollbacks, a restarted planner.

Every `checkpoint_interval` seconds, per job with local state: stop dispatching at a chunk boundary, send
the barrier (`ckpt_begin`) to every worker of the job, dispatch on; once every record below the boundary
is complete, ask for the snapshot (`ckpt_snapshot`); complete when every worker answered. A worker that
dies rolls the job back (`Checkpoints.restore`) to the newest complete checkpoint and replays the input log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from clasp.core import protocol
from clasp.core.checkpoint import (
    KEEP_COMPLETE,
    CheckpointError,
    CompleteCheckpoint,
    boundary_reached,
    dispatch_boundary,
    look_delay,
    next_due,
    recovery_placement,
)
from clasp.core.credit import charge
from clasp.core.lifecycle import (
    Barrier,
    BarrierSent,
    NoWorkerLeft,
    Phase,
    RollBack,
    RollbackFailed,
    RolledBack,
)
from clasp.core.tracking import CHUNK_BITS, LatencyHistogram
from clasp.runtime.input_log import stored_chunks
from clasp.runtime.planner_dispatch import Dispatcher
from clasp.runtime.planner_job import CHECKPOINTS_OFF, CheckpointsOff, CheckpointState
from clasp.runtime.planner_link import Link
from clasp.runtime.planner_queries import JobQueries
from clasp.runtime.planner_sinks import SinkCoordinator
from clasp.runtime.planner_sources import SourcesCoordinator, list_partitions, owners_under
from clasp.runtime.planner_time import TimeCoordinator
from clasp.runtime.state_store import FileStore, decode_blob, decode_collected, encode_blob, encode_collected
from clasp.runtime.tasks import wait_event

log = logging.getLogger("clasp.planner")
ALIGN_TIMEOUT = 30.0  # s for every record below a barrier to complete before the checkpoint is given up
SNAPSHOT_TIMEOUT = 60.0
# What a worker's snapshot answer times (s, the slowest worker's): packing on the loop, the file's write
# and the sinks' prepare off it, and, while its barrier was up, keeping the key groups' images.
WORKER_STAGES = ("pack_s", "write_s", "prepare_s", "cow_s")


class Checkpoints:
    """The checkpoint coordinator of every job: `for_job` gives a job its checkpointer (`CheckpointState`,
    or `CHECKPOINTS_OFF` without a state directory, an interval or local state). `jobs` and `workers` are
    the planner's tables; `state_endpoint()`: the planner's state server's address (bound once serving)."""

    def __init__(self, link: Link, store: FileStore | None, jobs: dict, workers: dict, queries: JobQueries,
                 dispatcher: Dispatcher, sinks: SinkCoordinator, sources: SourcesCoordinator,
                 time: TimeCoordinator, *,
                 interval: float, input_log_records: int, log_bytes: int, collected_memory: int, dead_after: float,
                 state_endpoint: Callable[[], str]):
        self.link, self.store, self.jobs, self.workers = link, store, jobs, workers
        self.queries, self.dispatcher, self.sinks, self.sources = queries, dispatcher, sinks, sources
        dispatcher.input_ended = self.persist  # `end_input` is in the job's record before it is answered
        self.time = time
        self.checkpoint_interval, self.input_log_records, self.log_bytes = interval, input_log_records, log_bytes
        self.collected_memory = collected_memory
        self.dead_after, self.state_endpoint = dead_after, state_endpoint
        self.recoveries = 0
        self.records_replayed = 0
        self.checkpoint_hist = LatencyHistogram()
        self.added = asyncio.Event()  # a job was deployed: the scheduler looks now (`deployed`)

    def for_job(self, job_id: int, state: str, stored: bool = False) -> CheckpointState | CheckpointsOff:
        """`stored`: a job taken up from the state directory (it had checkpoints, it keeps them)."""
        if not stored and not (self.checkpoint_interval > 0 and self.store is not None and state == "local"):
            return CHECKPOINTS_OFF
        # The log keeps a quarter of the queue's bound in memory: replays past that read from disk.
        return CheckpointState(self.store, job_id, self.input_log_records, self.log_bytes,
                               lambda: self.dispatcher.log_written(job_id), self.collected_memory)

    def fail_requests_of(self, wid: str) -> None:
        """A worker was declared dead: its outstanding requests fail now, and so do the migrations and
        checkpoint requests of its jobs that use checkpoints (the recovery rolls those back anyway)."""
        jobs = {j.id for j in self.jobs.values() if wid in j.workers and j.ckpt.enabled}
        for j in self.jobs.values():
            if j.id in jobs:
                j.ckpt.dying.add(wid)  # a checkpoint waiting under the job's lock gives up at once
                j.ckpt.poke()
        self.link.fail_requests_of(wid, jobs)

    # ----------------------------------------------------------------- checkpoints
    async def run(self) -> None:
        # A job's checkpoint is due `checkpoint_interval` after its last one started (`next_due`): one that
        # outlasts the interval delays the next by what it overran and a short gap, not by a whole interval.
        # Between looks the loop sleeps until the next one due, or less (`look_delay`).
        delay = 0.0
        while True:
            await wait_event(self.added, delay)
            self.added.clear()
            now = time.monotonic()
            due, held = [], False
            for job in list(self.jobs.values()):
                c = job.ckpt
                if not c.enabled or job.life.retired:
                    continue
                if (job.life.phase is not Phase.RUNNING or c.dying or c.coord.pending is not None
                        or job.lock.locked()):
                    held = True  # cannot start now: looked at again soon
                    continue
                if now < c.next_at:
                    due.append(c.next_at)
                    continue
                last = c.coord.restore_target()
                if (last is not None and not job.queue and job.tracker.next_chunk == last.boundary):
                    continue  # nothing admitted since the last checkpoint
                c.next_at = next_due(now, None, self.checkpoint_interval)
                due.append(c.next_at)
                self.link.background(self._scheduled(job, now), f"checkpoint of job {job.id}")
            delay = look_delay(now, due, held, self.checkpoint_interval)

    async def _scheduled(self, job, started: float) -> None:
        try:
            await self.checkpoint(job)
        finally:
            job.ckpt.next_at = next_due(started, time.monotonic(), self.checkpoint_interval)

    async def checkpoint(self, job) -> dict | None:
        c = job.ckpt
        async with job.lock:
            if self.jobs.get(job.id) is not job or job.life.retired or job.life.phase is not Phase.RUNNING:
                return None
            if c.dying or not self.queries.workers_of(job):
                return None
            c.want = True
            t_want = time.monotonic()
            try:
                deadline = t_want + ALIGN_TIMEOUT
                while (boundary := dispatch_boundary(job.queue, job.tracker)) is None:
                    if not await _moved(c, deadline) or c.dying:
                        c.coord.counts["failed"] += 1
                        log.warning("job %d: checkpoint given up: %s", job.id,
                                    "a worker died" if c.dying else "dispatch never reached a chunk boundary")
                        return None
                job.machine.handle(Barrier())
            finally:
                c.want = False
            if job.src is not None:
                # Above every chunk leased so far: a batch read before the barrier is below the cut (and no
                # lease is answered until every worker has the barrier: `SourcesCoordinator.on_lease`).
                boundary = max(boundary, job.tracker.next_chunk)
            workers = self.queries.workers_of(job)
            try:
                p = c.coord.begin(boundary, workers, time.monotonic())
            except CheckpointError:
                self.sources.barrier_sent(job)
                self.dispatcher.carry_out(job, job.machine.handle(BarrierSent()))
                raise
            p.watermark = self.time.released_levels(job)
            rid = boundary << CHUNK_BITS
            t_boundary = p.t0
            try:
                try:
                    begun = await asyncio.gather(*(self.link.rpc(w, protocol.CkptBegin(job.id, p.id, rid))
                                                   for w in workers))
                finally:
                    self.sources.barrier_sent(job)
                    self.dispatcher.carry_out(job, job.machine.handle(BarrierSent()))
                t_begun = time.monotonic()
                if job.src is not None:
                    # The partitions' positions at the cut; one read nowhere now (released by a stop) keeps
                    # its last known position.
                    p.positions = dict(job.src.positions)
                    for r in begun:
                        for op, part, pos in r.get("positions", ()):
                            p.positions[(op, part)] = pos
                deadline = time.monotonic() + ALIGN_TIMEOUT
                while not boundary_reached(job.tracker, boundary):
                    if c.dying or any(w not in self.queries.workers_of(job) for w in workers):
                        raise CheckpointError("a worker died")
                    if not await _moved(c, deadline):
                        raise CheckpointError(f"records below the barrier still open after {ALIGN_TIMEOUT} s")
                t_aligned = time.monotonic()
                ask = protocol.CkptSnapshot(job.id, p.id, rid, str(self.store.root))
                replies = await asyncio.gather(*(self.link.rpc(w, ask, SNAPSHOT_TIMEOUT)
                                                 for w in workers))
                t_snapped = time.monotonic()
            except Exception as e:
                failed = c.coord.fail(str(e))
                log.warning("job %d: checkpoint %d failed: %s", job.id, p.id, e)
                await asyncio.gather(*(self.link.rpc(w, protocol.CkptAbort(job.id, p.id), 2.0)
                                       for w in self.queries.workers_of(job)), return_exceptions=True)
                if failed is not None:
                    await asyncio.to_thread(self.store.delete, job.id, failed)
                return None
            c.last_pause = max((r["pause"] for r in replies), default=0.0)
            c.last_pause_cpu = max((r.get("pause_cpu", 0.0) for r in replies), default=0.0)
            for r in replies:
                for op, part in r["collected"].items():
                    protocol.check_packed_array(part, f"ckpt_snapshot.collected[{op!r}]")
                c.coord.ack(p.id, r["worker"], r["groups"], r["bytes"], r["collected"])
            done, collected = c.coord.finish(time.monotonic())
            below = job.tracker.admitted - sum(n for _, n in c.log.sizes_from(done.boundary).values())
            meta = {"job": job.id, "ckpt": done.id, "boundary": done.boundary, "groups": done.groups,
                    "bytes": done.bytes, "workers": workers, "t": time.time(), "records_below": below,
                    "positions": [[op, part, pos] for (op, part), pos in done.positions.items()],
                    "watermark": done.watermark}
            try:
                if collected:  # spliced in the thread: a copy of every output, off the event loop
                    await asyncio.to_thread(lambda: self.store.write_file(c.released_file(done.id),
                                                                          encode_collected(collected)))
                await asyncio.to_thread(self.store.commit, job.id, done.id, meta)
            except OSError as e:  # never complete: its files go, the one before stays the newest
                c.coord.not_committed(collected, f"checkpoint {done.id} not committed: {e}")
                log.error("job %d: checkpoint %d could not be committed: %s", job.id, done.id, e)
                await asyncio.to_thread(self.store.delete, job.id, done.id)
                return None
            dropped = c.coord.committed(done)
            if collected:
                c.release(done.id, collected)
            for d in dropped:
                await asyncio.to_thread(self.store.delete, job.id, d)
            c.log.drop_below(c.coord.log_floor())
            self.sinks.completed(job, done.id, replies)
            job.tracker.forget_sources_below(c.coord.log_floor())
            if job.src is not None:
                job.src.positions.update(done.positions)
            self.persist(job)
            self.checkpoint_hist.add(done.duration_s)
            c.stages.add({"boundary": t_boundary - t_want, "barrier": t_begun - t_boundary,
                          "align": t_aligned - t_begun, "snapshot": t_snapped - t_aligned,
                          "commit": time.monotonic() - t_snapped,
                          **{k: max(r.get(k, 0.0) for r in replies) for k in WORKER_STAGES}})
            log.debug("job %d: checkpoint %d complete at chunk %d: %d bytes in %.1f ms (max pause %.1f ms)",
                      job.id, done.id, done.boundary, done.bytes, done.duration_s * 1e3,
                      max(r["pause"] for r in replies) * 1e3 if replies else 0.0)
            return meta

    # ----------------------------------------------------------------- recovery
    async def restore(self, job, wid: str) -> None:
        """Worker `wid` of the job died: roll the job back to its last complete checkpoint on the workers
        left, and replay the input from there."""
        c = job.ckpt
        async with job.lock:
            if wid not in job.workers or wid in job.retired or self.jobs.get(job.id) is not job:
                c.dying.discard(wid)
                return
            t0 = time.monotonic()
            c.dying.discard(wid)
            job.lost_workers.add(wid)
            job.retired.add(wid)
            await self._rolling_back(job, f"worker {wid} died", t0)

    async def _rolling_back(self, job, cause: str, t0: float) -> None:
        """Under the job's lock: the rollback, in its phase from start to end (clasp.core.lifecycle)."""
        job.machine.handle(RollBack(cause))
        try:
            await self._roll_back(job, cause, t0)
        finally:
            if job.life.phase is Phase.ROLLING_BACK:
                job.machine.handle(RollbackFailed())
            self.dispatcher.wake.set()

    async def _roll_back(self, job, cause: str, t0: float) -> None:
        c = job.ckpt
        while True:
            alive = self.queries.workers_of(job)
            if not alive:
                log.error("job %d (%s) has no worker left: it waits for a worker to recover on", job.id, cause)
                job.machine.handle(NoWorkerLeft(cause))
                return
            new = recovery_placement(job.spec, job.placement, alive, job.key_weights, job.placement.epoch + 1)
            target = c.coord.restore_target()
            duties = self.sinks.recovery(job, alive)
            sources = None
            if job.src is not None:
                # Every partition reopens at the checkpoint's position (the job's start: the beginning).
                owners, positions, sources = self.sources.restore(job, new, alive,
                                                                  target.positions if target else None)
            peers = {w: self.workers[w].data for w in job.workers if w in self.workers}
            ckpt = target.id if target else 0
            ask = protocol.Restore(job.id, job.spec_wire, new.to_wire(), peers, ckpt, target.groups if target else {},
                                   str(self.store.root), state=job.state, state_server=self.state_endpoint(),
                                   run=self.sinks.run(job), sinks=duties, sources=sources,
                                   watermark=self.time.restore_point(job, target.watermark if target else None))
            replies = await asyncio.gather(*(self.link.rpc(w, ask, 30.0) for w in alive), return_exceptions=True)
            unreadable = [r["unreadable"] for r in replies if isinstance(r, dict) and r.get("unreadable")]
            if target is not None and unreadable:
                log.error("job %d: checkpoint %d cannot be restored (%s): falling back to the one before",
                          job.id, target.id, "; ".join(unreadable))
                job.errors.append({"worker": "planner", "operator": "", "value": "",
                                   "error": f"checkpoint {target.id} unreadable: {unreadable[0]}"[:300]})
                c.coord.discard(target.id)
                continue
            bad = [str(r) for r in replies if isinstance(r, Exception)]
            failed = [w for w, r in zip(alive, replies, strict=True) if isinstance(r, Exception)]
            if failed:
                # A worker that could not restore holds nothing of the job now: roll back without it.
                log.error("job %d: restore failed on %s (%s): rolling back without them", job.id, failed, bad)
                job.retired.update(failed)
                continue
            job.placement = new
            job.settled = new
            self.dispatcher.set_routes(job)
            self.sinks.recovered(job, duties, replies, alive)
            upto = target.id if target else 0
            c.coord.rolled_back()
            for k in [k for k in c.released_by if k > upto]:  # released by a checkpoint rolled back over
                c.forget_released(k)
            boundary = target.boundary if target else 0
            dispatched_before = job.counters["dispatched"]
            c.replay_to = max(c.replay_to, job.tracker.completed + job.tracker.lost)
            reopened, _ = job.tracker.rollback(boundary, c.log.sizes_from(boundary))
            if job.src is not None:
                self.sources.restored(job, owners, positions)
            self.time.rolled_back(job)
            job.clear_queue()
            for chunk in c.log.sizes_from(boundary):
                # Replayed chunks not in memory stay on disk until they are due (`_dispatch` reads them).
                job.queue.append([chunk << CHUNK_BITS, c.log.in_memory_records(chunk), 0])
                job.queue_bytes.admit(c.log.nbytes(chunk))
            job.queued = reopened
            job.counters["dispatched"] = job.tracker.admitted - job.tracker.read - reopened
            replayed = max(0, dispatched_before - job.counters["dispatched"])
            c.replayed += replayed
            self.records_replayed += replayed
            c.coord.counts["recoveries"] += 1
            self.recoveries += 1
            took = time.monotonic() - t0
            reason = (f"{cause}: job rolled back to checkpoint {target.id if target else 0} "
                      f"on {len(alive)} workers, {replayed} records replayed")
            c.last_recovery = {"t": round(time.time() - job.created, 3), "cause": cause,
                               "checkpoint": target.id if target else 0, "replayed": replayed,
                               "duration_s": took, "epoch": new.epoch}
            job.decisions.append({"t": round(time.time() - job.created, 3), "trigger": cause,
                                  "reason": reason, "change": True})
            log.warning("job %d: %s (%.0f ms)", job.id, reason, took * 1e3)
            job.machine.handle(RolledBack())
            self.persist(job)
            return

    async def resume_orphan(self, job) -> None:
        """Under the job's lock: a worker joined a job that had lost every worker; roll back onto it."""
        await self._rolling_back(job, job.life.orphaned, time.monotonic())

    def deployed(self, job) -> None:
        """A submitted job is deployed: its record is written, and its first checkpoint (of an empty job) is
        due now, before its input comes (the scheduler may be asleep until another job's is due)."""
        self.added.set()
        self.persist(job)

    # ----------------------------------------------------------------- planner restart
    def persist(self, job) -> None:
        """The job's record in the state directory, for a planner restarted on it. The key groups' measured
        weights go with a record written for another change, and change no record by themselves: they move at
        every tick, and each checkpoint wrote and fsynced the record on the event loop for them."""
        if self.store is None or not job.ckpt.enabled:
            return
        rec = {"id": job.id, "dag": job.spec_wire, "placement": job.placement.to_wire(), "workers": job.workers,
               "autoscale": job.autoscale, "policy": job.policy, "state": job.state,
               "created": job.created, "sinks": self.sinks.book(job).pending if self.sinks.has_sinks(job) else {},
               "input_ended": job.input_ended}
        seen = encode_blob(rec)
        if seen == job.ckpt.persisted:
            return  # as written last (most checkpoints change nothing of it): no fsync on the event loop
        rec["key_weights"] = job.key_weights
        try:
            self.store.write_file(f"job-{job.id}/job.kg", encode_blob(rec))
        except OSError as e:
            log.error("job %d: its record could not be written: %s", job.id, e)
            return
        job.ckpt.persisted = seen

    def stored_jobs(self) -> list[dict]:
        """Every job record a previous planner left in the state directory, with its checkpoints and input."""
        out = []
        if self.store is None:
            return out
        for d in sorted(self.store.root.glob("job-*"), key=lambda p: p.name):
            data = self.store.read_file(f"{d.name}/job.kg")
            if data is None:
                continue
            try:
                rec = decode_blob(data, str(d / "job.kg"))
            except Exception as e:
                log.error("%s", e)
                continue
            complete = []
            top = 0
            for ck in d.glob("ckpt-*"):
                top = max(top, int(ck.name.split("-", 1)[1]))
                try:
                    meta = json.loads((ck / "COMPLETE.json").read_text())
                except (OSError, ValueError):  # never completed (or its marker is unreadable): not a checkpoint
                    self.store.delete(int(rec["id"]), int(ck.name.split("-", 1)[1]))
                    continue
                complete.append(meta)
            complete.sort(key=lambda m: m["ckpt"])
            rec["next_ckpt"] = top + 1
            chunks = stored_chunks(d / "input")
            released: dict[int, dict | None] = {}
            last = complete[-1]["ckpt"] if complete else 0
            room = self.collected_memory  # the newest read back into memory, the older left in their files
            for k in sorted((int(f.stem) for f in (d / "collected").glob("*.kg")), reverse=True):
                if k <= last:
                    f = d / "collected" / f"{k}.kg"
                    released[k] = decode_collected(f.read_bytes(), str(f)) if room > 0 else None
                    room -= f.stat().st_size
            out.append({"rec": rec, "complete": complete[-KEEP_COMPLETE:], "chunks": chunks,
                        "released": released})
        return out

    def revive(self, job, stored: dict) -> None:
        """Fill a job rebuilt from its record: checkpoints, input log, tracker and queue as of its newest
        complete checkpoint; it resumes once its workers registered again (`resume`)."""
        c = job.ckpt
        for m in stored["complete"]:
            positions = {(op, part): pos for op, part, pos in m.get("positions", ())}
            c.coord.complete.append(CompleteCheckpoint(m["ckpt"], m["boundary"], m["groups"], m["bytes"],
                                                       positions=positions, watermark=m.get("watermark")))
        # The rollback that resumes the job reopens the readers at the checkpoint's positions; a DAG with keyed
        # time operators and no declared source has its (empty) source state too: the windows its workers
        # fire take chunk ids from its leases.
        job.src = list_partitions(job.spec)
        if job.src is not None:
            job.src.owners = owners_under(job.src, job.placement, job.workers, {})
        c.coord.next_id = stored["rec"].get("next_ckpt", 1)
        job.input_ended = bool(stored["rec"].get("input_ended"))  # later pushes refused, the watermark ends
        for k, collected in sorted(stored["released"].items()):
            c.release(k, collected)
        if stored["rec"].get("sinks"):
            self.sinks.book(job).pending = {int(k): v for k, v in stored["rec"]["sinks"].items()}
        newest = stored["complete"][-1] if stored["complete"] else None
        boundary, below = (newest["boundary"], newest["records_below"]) if newest else (0, 0)
        floor = c.coord.log_floor()
        now = time.monotonic()
        for chunk, (size, nbytes, where) in stored["chunks"].items():
            c.log.load(chunk, size, now, charge(nbytes, size), where)
        c.log.drop_below(floor)  # what the planner that died had not removed yet goes now
        t = job.tracker
        t.next_chunk = max([*c.log.entries, boundary - 1]) + 1
        sizes = c.log.sizes_from(boundary)
        t.chunks = {ch: [now, n, n] for ch, (_, n) in sizes.items()}
        t.admitted = below + sum(n for _, n in sizes.values())
        t.completed = below
        job.counters["pushed"] = t.admitted
        job.counters["dispatched"] = t.admitted
        job.placement.epoch += 1000  # past any epoch the workers reached under the previous planner

    async def resume(self, job) -> None:
        """A restarted planner: wait for the job's workers to register again, then roll back onto them."""
        deadline = time.monotonic() + max(10.0, 2 * self.dead_after)
        while time.monotonic() < deadline:
            if all(w in self.workers and self.workers[w].alive for w in job.workers):
                break
            await asyncio.sleep(0.1)
        async with job.lock:
            for w in job.workers:
                if not (w in self.workers and self.workers[w].alive):
                    job.retired.add(w)  # not back in time: what it still holds of the job is ignored
            await self._rolling_back(job, "planner restarted", time.monotonic())

    def metrics(self, jobs: list, _buckets):
        """The checkpoint families of the planner's Prometheus collector (`_buckets`: its histogram folding)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        jobs_c = [j for j in jobs if j.ckpt.enabled]
        ck = CounterMetricFamily("clasp_checkpoints", "Checkpoints by outcome", labels=["outcome"])
        for outcome in ("completed", "failed"):
            ck.add_metric([outcome], sum(j.ckpt.coord.counts[outcome] for j in jobs_c))
        yield ck
        cd = HistogramMetricFamily("clasp_checkpoint_duration_seconds", "Barrier sent to last worker's ack")
        cd.add_metric([], _buckets(self.checkpoint_hist, (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                                                          10.0)), self.checkpoint_hist.sum)
        yield cd
        cb = GaugeMetricFamily("clasp_checkpoint_bytes", "Bytes written by the job's last complete checkpoint",
                               labels=["job"])
        for j in jobs_c:
            cb.add_metric([str(j.id)], j.ckpt.coord.last_bytes)
        yield cb
        rc = CounterMetricFamily("clasp_recoveries", "Jobs rolled back to a checkpoint after a worker died")
        rc.add_metric([], self.recoveries)
        yield rc
        rr = CounterMetricFamily("clasp_records_replayed", "Records dispatched again from the input log")
        rr.add_metric([], self.records_replayed)
        yield rr
        lw = CounterMetricFamily("clasp_input_log_write_failures", "Input chunks the input log could not write "
                                 "to disk (kept in memory instead)", labels=["job"])
        for j in jobs_c:
            lw.add_metric([str(j.id)], j.ckpt.log.write_failures)
        yield lw

    def stats(self, job) -> dict | None:
        c = job.ckpt
        if not c.enabled:
            return None
        last = c.coord.restore_target()
        return {**c.coord.counts, "replayed": c.replayed, "last_id": last.id if last else 0,
                "last_duration_s": c.coord.last_duration, "last_bytes": c.coord.last_bytes,
                "last_pause_s": c.last_pause, "last_pause_cpu_s": c.last_pause_cpu,
                "pending": c.coord.pending.id if c.coord.pending else None,
                "input_log_records": c.log.records_kept, "input_log_spilled": c.log.spilled,
                "input_log_write_failures": c.log.write_failures,
                "collected_in_memory_bytes": c.released_in_memory(),
                "collected_checkpoints_on_disk_only": sum(v is None for v in c.released_by.values()),
                "failures": list(c.coord.failures), "last_recovery": c.last_recovery,
                "stages_ms": c.stages.means_ms(),
                "interval_s": self.checkpoint_interval, "serving": self.queries.workers_of(job)}


async def _moved(c: CheckpointState, deadline: float) -> bool:
    """Wait until the job's dispatcher ran (records dispatched or completed) or a worker was declared dead
    (`CheckpointState.poke`); False once `deadline` (monotonic) passed."""
    c.moved.clear()
    try:
        async with asyncio.timeout(deadline - time.monotonic()):
            await c.moved.wait()
    except TimeoutError:
        return False
    return True
