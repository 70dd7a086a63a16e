"""The planner's migration runner: a job's placement changes (`job.scale`, `job.place`, the control loop's
decisions, a worker's death without checkpoints) carried out with the decentralized migration protocol
(`clasp.core.migration`: plan, broadcast `migrate_plan`, wait for every participant), the control loop's
tick per job (the autoscaler's decisions, and key groups rebalanced by their measured load,
`clasp.core.control.Rebalancer`), and the sweep that counts the records lost with a dead worker. It owns the counters of
migrations and records lost."""

from __future__ import annotations

import asyncio
import logging
import time

from clasp.core import protocol, scheduler
from clasp.core.control import ControlConfig, Controller, key_weights, observation, pool_order, to_runtime_placement
from clasp.core.lifecycle import Migrate, Migrated, Phase
from clasp.core.migration import PLANNER, plan_migration
from clasp.core.partitions import readers_follow
from clasp.core.policies import POLICIES
from clasp.core.routing import Placement, build_placement
from clasp.core.tracking import LatencyHistogram
from clasp.runtime.elastic import ElasticPool
from clasp.runtime.planner_dispatch import Dispatcher
from clasp.runtime.planner_job import PlannerJob
from clasp.runtime.planner_link import Link, RequestError
from clasp.runtime.planner_queries import JobQueries
from clasp.runtime.planner_sources import SourcesCoordinator

log = logging.getLogger("clasp.planner")



class Migrations:
    """`workers` and `pushers` are the planner's tables; the collaborators are the planner's."""

    def __init__(self, link: Link, queries: JobQueries, dispatcher: Dispatcher, sources: SourcesCoordinator,
                 elastic: ElasticPool, workers: dict, pushers: dict, *, p_max: int, control: ControlConfig,
                 migration_timeout: float, rebalance: bool = True):
        self.link, self.queries, self.dispatcher = link, queries, dispatcher
        self.sources, self.elastic = sources, elastic
        self.workers, self.pushers = workers, pushers
        self.p_max, self.control_config, self.migration_timeout = p_max, control, migration_timeout
        self.rebalance = rebalance  # key groups follow their measured load, autoscaling on or off
        self.rescales = 0
        self.records_lost = 0  # cumulative over every job, for clasp_records_lost_total
        self.migration_hist = {"planner": LatencyHistogram(), "worker": LatencyHistogram()}

    def controller(self, spec, policy: str, workers: int) -> Controller:
        """A job's control loop; its model knows which operators the engines route local first (the
        stateless ones) and which by key."""
        return Controller([o.name for o in spec.operators], spec.edges(), POLICIES[policy](), self.p_max, workers,
                          self.control_config, stateless=tuple(o.name for o in spec.operators if not o.stateful),
                          keyed=tuple(o.name for o in spec.operators if o.stateful), local_first=True)

    async def on_scale(self, ident: bytes, msg: protocol.Scale) -> None:
        job = self.queries.job(msg)
        n = msg.workers
        pool = self.pool(job)
        if not 1 <= n <= self.elastic.max_pool(len(pool)):
            raise RequestError(f"scale to {n} workers: the job's pool has {len(pool)} live workers")
        if n > len(pool):
            pool = await self.elastic.acquire(job, n)  # the provider starts them; they join the pool
            if n > len(pool):
                raise RequestError(f"scale to {n} workers: asked the {self.elastic.provider.name} provider, "
                                   f"{len(pool)} are in the job's pool after {self.elastic.config.join_timeout:g} s")
        async with job.lock:
            pool = self.pool(job)
            result = job.controller.place_on(n, pool)
            job.decisions.append({"t": round(time.time() - job.created, 3), "trigger": f"job.scale({n})",
                                  "reason": result.reason or f"manual scale to {n} workers", "change": True,
                                  "workers": result.workers, "predicted_rate": result.rate})
            record = await self.place_result(job, result, f"manual scale to {n} workers", pool)
        self.link.reply(ident, msg.req, record)

    async def on_place(self, ident: bytes, msg: protocol.Place) -> None:
        """Migrate to an explicit placement, operator -> {pool index -> share} (pool: active workers first)."""
        job = self.queries.job(msg)
        async with job.lock:
            pool = pool_order(job.placement, self.elastic.pool_ids(self.queries.workers_of(job)))
            new = build_placement(job.spec, pool, msg.placement, self.p_max, job.placement.epoch + 1,
                                  previous=job.placement, weights=job.key_weights)
            record = await self.run(job, new, "manual placement")
        self.link.reply(ident, msg.req, record)

    def on_autoscale(self, ident: bytes, msg: protocol.Autoscale) -> None:
        job = self.queries.job(msg)
        job.autoscale = msg.enabled
        log.info("job %d: autoscaling %s", job.id, "on" if job.autoscale else "off")
        self.link.reply(ident, msg.req, job.autoscale)

    async def apply_decision_locked(self, job: PlannerJob, result, reason: str, pool: list[str]) -> None:
        """A control-loop decision, taken in the background: `place_result` under the job's lock."""
        async with job.lock:
            serving = set(self.queries.workers_of(job))
            # A worker of the decision's pool that died since: its indices mean nothing now; re-map to today's.
            await self.place_result(job, result, reason, pool if serving.issuperset(pool) else None)

    def pool(self, job: PlannerJob) -> list[str]:
        """The worker ids behind the policy's indices: larger CPU allowances first (`pool_order`)."""
        return pool_order(job.placement, self.elastic.pool_ids(self.queries.workers_of(job)),
                          {w: self.workers[w].sample.get("cpus") for w in job.workers if w in self.workers})

    async def place_result(self, job: PlannerJob, result, reason: str, pool: list[str] | None = None) -> dict:
        """Carry out a policy's placement with the decentralized protocol; returns the migration record.
        `pool`: the ids the policy's indices meant when it decided (default: the pool now)."""
        pool = self.pool(job) if pool is None else pool
        new = to_runtime_placement(job.spec, result, pool, job.placement, job.placement.epoch + 1, job.key_weights)
        if job.src is not None:
            new = readers_follow(job.spec, new)
        record = await self.run(job, new, reason)
        job.controller.placed(result)
        return record

    async def run(self, job: PlannerJob, new: Placement, reason: str) -> dict:
        """Steps 1, 2 and 7 of the protocol: plan, broadcast, wait for every participant's completion."""
        serving = set(self.queries.workers_of(job))
        dead = sorted(w for w in job.workers if w not in serving)
        old = job.placement
        plan = plan_migration(job.spec, old, new, job.workers, dead)
        t0 = time.monotonic()
        job.machine.handle(Migrate())
        marker = protocol.pack(protocol.Marker(job.id, new.epoch, PLANNER))
        for w in plan.markers_to_send(PLANNER):
            self.pushers[w].send(marker)
        job.placement = new
        self.dispatcher.set_routes(job)  # records dispatched from now on follow the new epoch
        ask = protocol.MigratePlan(job.id, plan.to_wire(), new.to_wire())
        replies = await asyncio.gather(*(self.link.rpc(w, ask, self.migration_timeout)
                                         for w in plan.participants), return_exceptions=True)
        if job.src is not None:
            await self.sources.move_partitions(job)
        duration = time.monotonic() - t0
        self.dispatcher.carry_out(job, job.machine.handle(Migrated()))
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

    async def recover(self, job: PlannerJob, wid: str) -> None:
        """A worker of the job died: re-place its share on the workers that remain (its state is lost)."""
        async with job.lock:
            old = job.placement
            if wid not in job.workers or wid in job.retired:
                return
            # Even when it held nothing any more, a plan naming it dead releases peers waiting for it.
            job.lost_workers.add(wid)
            job.retired.add(wid)
            alive = self.queries.workers_of(job)
            if not alive:
                log.error("job %d lost its last worker %s", job.id, wid)
                return
            r = scheduler.plan_recovery(job.spec, old, job.settled, wid, alive, job.queue, job.tracker.next_chunk,
                                        job.key_weights, time.time() - job.created)
            job.decisions.append(r.decision)
            job.tracker.suspect_below(r.fence)
            self.dispatcher.wake.set()
            await self.run(job, r.placement, r.reason)

    def _sweep_lost(self, job: PlannerJob, clean: bool) -> None:
        """After a worker died, records whose weight died with it never complete. A check is clean when
        no survivor holds anything of a suspect record; after two clean checks a tick apart with no suspect
        completing in between (a request on the wire between survivors shows up in one of them), count
        the suspects still open as lost."""
        t = job.tracker
        job.sweep, lose = scheduler.sweep_step(job.sweep, t.suspects, job.life.migrating, clean)
        if not lose:
            return
        n = t.lose_suspects()
        self.records_lost += n
        log.error("job %d: %d records lost with worker(s) %s", job.id, n, ",".join(sorted(job.lost_workers)))
        job.errors.append(scheduler.lost_error(n, job.lost_workers))
        if t.outstanding == 0 and job.queued == 0:
            self.queries.check_waiters(job)

    async def check_idle(self, job: PlannerJob) -> None:
        workers = self.queries.workers_of(job)
        ask = protocol.Counters(job.id, below=job.tracker.fence)
        try:
            counters = await asyncio.gather(*(self.link.rpc(w, ask, 2.0) for w in workers))
        except RequestError:
            return
        self._sweep_lost(job, not any(c["holds_below"] for c in counters))

    def control(self, job: PlannerJob, rate_in: float, rate_out: float) -> None:
        """One control-loop tick for one job: feed the estimator, and re-plan when a trigger fires."""
        pool = self.pool(job)
        samples = {w: self.workers[w].sample for w in job.workers if w in self.workers}
        job.key_weights = key_weights(job.spec, samples, job.id, job.key_weights)
        obs = observation(job.spec, samples, job.id, rate_in, rate_out, job.tracker.completed, job.queued,
                          job.placement, pool)
        job.controller.pool = self.elastic.max_pool(len(pool))  # the provider's ceiling: workers that may join
        step = job.controller.observe(obs, decide=job.autoscale and not job.life.migrating
                                      and job.id not in self.elastic.waiting)
        e = step.estimate
        job.estimate = {"alpha": e.alpha, "beta": e.beta, "beta_receive": e.beta_receive, "mu": e.mu,
                        "gamma": e.gamma, "capacity": e.capacity, "flush_delay": e.flush_delay,
                        "capacities": {w: round(c, 1) for w, c in e.capacities.items()}, "terms": dict(e.terms),
                        "observations": job.controller.estimator.observations,
                        "saturated": list(e.saturated), "reason": e.reason}
        if step.trigger is None:
            self._rebalance_tick(job)
            return
        d = step.decision
        entry = {"t": round(time.time() - job.created, 3), "trigger": step.trigger, "reason": d.reason,
                 "change": d.change, "workers": d.workers, "predicted_rate": d.placement.rate if d.change else None}
        job.decisions.append(entry)
        log.info("job %d: %s -> %s", job.id, step.trigger, d.reason if d.change else f"no change: {d.reason}")
        if d.change and d.placement.workers > len(pool):
            self.link.background(self.elastic.decide_later(job, d.placement.workers, f"{step.trigger}: {d.reason}"),
                             f"re-placement of job {job.id} on workers asked for")
        elif d.change:
            self.link.background(self.apply_decision_locked(job, d.placement, f"{step.trigger}: {d.reason}", pool),
                             f"re-placement of job {job.id}")

    def _rebalance_tick(self, job: PlannerJob) -> None:
        """The job's key groups re-owned by their measured load when an owner carries too much more than
        its share (`Rebalancer`); not while anything else holds the job (a migration, a checkpoint, a scale)."""
        if not self.rebalance:
            return
        held = job.life.phase is not Phase.RUNNING or job.lock.locked() or job.id in self.elastic.waiting
        r = job.rebalancer.tick(job.spec, job.placement, job.key_weights, held)
        if r is not None:
            self.link.background(self._rebalance(job, *r), f"key-group rebalance of job {job.id}")

    async def _rebalance(self, job: PlannerJob, new: Placement, reason: str) -> None:
        async with job.lock:
            if job.placement.epoch + 1 != new.epoch or job.life.phase is not Phase.RUNNING:
                return  # the job moved on since the decision: the next ticks decide again
            job.decisions.append({"t": round(time.time() - job.created, 3), "trigger": "keyed load skewed",
                                  "reason": reason, "change": True, "workers": len(new.active_workers()),
                                  "predicted_rate": None})
            log.info("job %d: %s", job.id, reason)
            await self.run(job, readers_follow(job.spec, new) if job.src is not None else new, reason)
