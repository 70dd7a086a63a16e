"""The planner's elastic pool: workers join running jobs, leave them gracefully, and are asked for and given back.

- **Join.** A worker that registers while jobs run joins every job's pool at once: the job's workers are
  told its data endpoint (`peers`, so they connect before any send, as at deploy), it is deployed each
  job holding nothing, and the job's next re-plan or `job.scale(n)` may place on it.
- **Leave.** `clasp drain WORKER` (the `drain` request) or SIGTERM to the worker (it sends `leave`) marks
  it leaving: no placement uses it again; each job it holds part of is live-migrated off it (the
  migration protocol: nothing lost, per-key order kept), it leaves the jobs' pools, and the planner tells
  it `shutdown`: it exits 0.
- **Ask and give back.** Each tick the pure `clasp.core.pool.pool_wish` says how many workers the cluster
  should have and which idle ones to release (after a cooldown); the provider (`clasp.runtime.providers`)
  carries that out. A decision that needs more workers than the pool has asks for them and waits for them
  to join (`acquire`), up to `join_timeout`, then places on those that came.

The planner's part is a handful of calls (`joined`, `on_drain`, `on_leave`, `on_pool`, `tick`, `acquire`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from clasp.core import protocol
from clasp.core.pool import PoolState, PoolWish, demand, max_pool, pool_wish, update_idle
from clasp.core.routing import Placement
from clasp.core.scheduler import survivor_placement
from clasp.runtime.planner_job import PlannerJob
from clasp.runtime.planner_link import Link, PoolError
from clasp.runtime.planner_queries import JobQueries
from clasp.runtime.providers import Provider

log = logging.getLogger("clasp.planner")


class Migrator(Protocol):
    """What the pool asks of the planner's migration runner (`clasp.runtime.planner_migration.Migrations`)."""

    def pool(self, job: PlannerJob) -> list[str]: ...

    async def apply_decision_locked(self, job: PlannerJob, result, reason: str, pool: list[str]) -> None: ...

    async def run(self, job: PlannerJob, new: Placement, reason: str) -> dict: ...


class ElasticPool:
    """`jobs`, `workers` and `pushers` are the planner's tables; `live_workers()`: alive workers in
    registration order; `state_endpoint()`: the planner's state server; `migrations` (the planner's
    migration runner, which asks this pool for its workers) is set once both are built."""

    def __init__(self, link: Link, jobs: dict, workers: dict, pushers: dict, queries: JobQueries, *,
                 live_workers: Callable[[], list[str]], state_endpoint: Callable[[], str],
                 provider: Provider | None = None):
        self.link, self.jobs, self.workers, self.pushers, self.queries = link, jobs, workers, pushers, queries
        self.live_workers, self.state_endpoint = live_workers, state_endpoint
        self.migrations: Migrator | None = None
        self.provider = provider or Provider()
        self.config = self.provider.config
        self.state = PoolState()
        self.leaving: set[str] = set()  # draining, or released to the provider: no placement uses them
        self.departed: set[tuple[str, int]] = set()  # (id, pid) of processes drained: not welcomed again
        self.waiting: set[int] = set()  # jobs whose decision waits for workers to join
        self.wish: PoolWish | None = None
        self.joins = 0
        self.drains: list[dict] = []  # what each drain did (worker, seconds, jobs migrated)

    # ----------------------------------------------------------------- what the planner asks
    def pool_ids(self, ids: list[str]) -> list[str]:
        """`ids` without the workers leaving."""
        return [w for w in ids if w not in self.leaving]

    def max_pool(self, live: int) -> int:
        return max_pool(self.config, live)

    def refuses(self, wid: str, pid: int) -> bool:
        return (wid, pid) in self.departed

    # ----------------------------------------------------------------- join
    def joined(self, wid: str) -> None:
        """A worker registered for the first time (or again after it was drained): join every job."""
        self.leaving.discard(wid)
        for job in list(self.jobs.values()):
            self.link.background(self._join(job, wid), f"worker {wid} joining job {job.id}")

    async def _join(self, job: PlannerJob, wid: str) -> None:
        async with job.lock:
            info = self.workers.get(wid)
            if (self.jobs.get(job.id) is not job or job.life.retired or wid in job.workers or info is None
                    or not info.alive):
                return
            serving = self.queries.workers_of(job)
            await asyncio.gather(*(self.link.rpc(w, protocol.Peers(job.id, {wid: info.data}))
                                   for w in serving))
            peers = {w: self.workers[w].data for w in [*serving, wid]}
            await self.link.rpc(wid, protocol.Deploy(job.id, job.spec.pack(), job.placement.to_wire(), peers,
                                                     state=job.state, state_server=self.state_endpoint(),
                                                     floor=job.ckpt.floor(job.placement)))
            job.workers.append(wid)
            job.retired.discard(wid)
            self.joins += 1
            log.info("worker %s joined job %d's pool (now %d workers)", wid, job.id, len(self.queries.workers_of(job)))

    # ----------------------------------------------------------------- acquire
    async def acquire(self, job: PlannerJob, n: int) -> list[str]:
        """Ask the provider for `n` workers for `job` and wait (up to join_timeout) until they joined the
        job's pool; returns the pool then (possibly smaller than `n`)."""
        pool = self.migrations.pool(job)
        want = demand(self.config, n, len(pool))
        if want is None:
            return pool
        self.state.demands[job.id] = want
        self.tick()
        log.info("job %d needs %d workers, its pool has %d: asked the %s provider", job.id, n, len(pool),
                 self.provider.name)
        deadline = time.monotonic() + self.config.join_timeout
        try:
            while len(pool := self.migrations.pool(job)) < want and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            self.state.demands.pop(job.id, None)
        return pool

    async def decide_later(self, job: PlannerJob, needed: int, reason: str) -> None:
        """A control-loop decision for more workers than the pool has: acquire them, then place on them."""
        self.waiting.add(job.id)
        try:
            pool = await self.acquire(job, needed)
            if self.jobs.get(job.id) is not job:
                return
            result = job.controller.place_on(min(needed, len(pool)), pool)
            await self.migrations.apply_decision_locked(job, result, reason, pool)
        finally:
            self.waiting.discard(job.id)

    # ----------------------------------------------------------------- leave
    def on_drain(self, ident: bytes, msg: protocol.Drain):
        if msg.worker not in self.workers:
            raise PoolError(f"no worker {msg.worker!r}")
        return self._drain_reply(ident, msg)

    async def _drain_reply(self, ident: bytes, msg: protocol.Drain) -> None:
        ok, detail = await self.drain(msg.worker, "clasp drain")
        if not ok:
            raise PoolError(detail)
        self.link.reply(ident, msg.req, {"worker": msg.worker, "detail": detail})

    def on_leave(self, ident: bytes, msg: protocol.Leave) -> None:
        if ident != msg.id.encode() or msg.id not in self.workers:
            return
        self.link.background(self.drain(msg.id, "SIGTERM"), f"drain of worker {msg.id}")

    async def drain(self, wid: str, why: str) -> tuple[bool, str]:
        """Migrate everything of every job off `wid`, drop it from the pools, tell it to exit."""
        info = self.workers.get(wid)
        if info is None:
            return False, f"no worker {wid!r}"
        self.leaving.add(wid)
        t0 = time.monotonic()
        moved = []
        log.info("draining worker %s (%s)", wid, why)
        for job in list(self.jobs.values()):
            async with job.lock:
                if wid not in job.workers:
                    continue
                if wid in job.placement.active_workers():
                    others = self.migrations.pool(job)
                    if not others:
                        self.leaving.discard(wid)
                        detail = (f"cannot drain worker {wid}: it is the last worker of job {job.id} "
                                  "(start another worker first)")
                        log.error("%s", detail)
                        if why == "SIGTERM":
                            await self.link.send(wid.encode(),
                                                 protocol.pack(protocol.Shutdown(False, detail)))
                        return False, detail
                    new = survivor_placement(job.spec, job.placement, others, job.key_weights)
                    record = await self.migrations.run(job, new, f"worker {wid} drained ({why})")
                    if record["failed"]:
                        self.leaving.discard(wid)
                        return False, f"the migration off {wid} failed on {sorted(record['failed'])}"
                    job.controller.current = None  # the policy's placement no longer describes the job
                    job.controller._cooldown = job.controller.config.cooldown_seconds
                    moved.append(job.id)
                job.workers.remove(wid)
                job.retired.discard(wid)
        seconds = time.monotonic() - t0
        self.drains.append({"worker": wid, "seconds": seconds, "jobs": moved, "why": why})
        detail = f"worker {wid} drained in {seconds * 1e3:.0f} ms ({len(moved)} job(s) migrated off it)"
        log.info("%s", detail)
        self.departed.add((wid, info.pid))
        await self.link.send(wid.encode(), protocol.pack(protocol.Shutdown(True, detail)))
        self.workers.pop(wid, None)
        pusher = self.pushers.pop(wid, None)
        if pusher is not None:
            pusher.close(linger=1000)
        self.leaving.discard(wid)
        self.state.idle_since.pop(wid, None)
        self.tick()
        return True, detail

    # ----------------------------------------------------------------- the provider
    def on_pool(self, ident: bytes, msg: protocol.Pool) -> None:
        self.tick()
        wish = self.wish or PoolWish(len(self.live_workers()))
        self.link.reply(ident, msg.req, {"provider": self.provider.name, "wish": wish.to_wire(),
                                       "workers": self.live_workers(), "leaving": sorted(self.leaving),
                                       "min_workers": self.config.min_workers,
                                       "max_workers": self.config.max_workers, "joins": self.joins,
                                       "drains": self.drains[-20:]})

    def tick(self) -> None:
        """Recompute the wish (once a tick, and when something changed); hand a new one to the provider."""
        now = time.monotonic()
        live = self.pool_ids(self.live_workers())
        busy = set()
        for job in self.jobs.values():
            busy.update(job.placement.active_workers())
        update_idle(self.state, live, busy, now)
        wish = pool_wish(self.config, self.state, live, now, self.provider.release_order(live))
        release = self.provider.restrict(live, wish.release)
        if release != wish.release:
            wish = PoolWish(len(live) - len(release), release, wish.reason)
        for w in release:
            self.leaving.add(w)
        # Released earlier and still registered: keep asking for them to stop.
        gone = tuple(w for w in sorted(self.leaving) if w in self.workers and w not in release)
        wish = PoolWish(wish.workers, (*release, *gone), wish.reason)
        if wish != self.wish:
            if self.wish is None or (wish.workers, wish.release) != (self.wish.workers, self.wish.release):
                log.info("pool: %d workers wanted, releasing %s (%s; %s provider)", wish.workers,
                         ",".join(wish.release) or "none", wish.reason, self.provider.name)
            self.wish = wish
            self.provider.apply(wish)
