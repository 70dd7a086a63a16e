"""The planner's sinks coordinator (clasp.core.sinks): the commits each job's sinks owe, and driving them.

When a checkpoint completes, each worker is told to commit what its sink partitions prepared for it
(`sink_commit`); the commits owed stay in the job's `SinkBook` until acknowledged, and a recovery hands them
to the survivors with the dead workers' partitions to abort. `wait_idle` returns only once every sink has
committed everything derived from the input so far: with checkpoints, once a checkpoint covers every record
admitted and its commits are acknowledged; without, after every worker flushed and committed its
partitions (`sink_flush`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from clasp.core import protocol
from clasp.core.sinks import SinkBook, run_token
from clasp.runtime.planner_link import Link

log = logging.getLogger("clasp.planner")
COMMIT_TIMEOUT = 60.0


class SinkCoordinator:
    """Owns every job's `SinkBook` and commit lock. `workers_of(job)`: the job's serving workers;
    `checkpoint(job)`: take a checkpoint now (None when it failed); `changed(job)`: what the job's
    `wait_idle` waiters wait on moved."""

    def __init__(self, link: Link, workers_of: Callable[[object], list[str]],
                 checkpoint: Callable[[object], Awaitable[object]], changed: Callable[[object], None]):
        self.link = link
        self.workers_of = workers_of
        self.checkpoint = checkpoint
        self.changed = changed
        self.books: dict[int, SinkBook] = {}
        self.locks: dict[int, asyncio.Lock] = {}

    def book(self, job) -> SinkBook:
        book = self.books.get(job.id)
        if book is None:
            book = self.books[job.id] = SinkBook()
        return book

    def _lock(self, job) -> asyncio.Lock:
        return self.locks.setdefault(job.id, asyncio.Lock())

    @staticmethod
    def has_sinks(job) -> bool:
        return any(o.kind == "sink" for o in job.spec.operators)

    @staticmethod
    def run(job) -> str:
        return run_token(job.id, job.created)

    def completed(self, job, ckpt: int, replies: list) -> None:
        """Checkpoint `ckpt` is complete (its COMPLETE.json written): its partitions may commit."""
        if not self.has_sinks(job):
            return
        todo = self.book(job).completed(ckpt, {r["worker"]: r.get("sinks") or {} for r in replies})
        if todo:
            self.link.background(self.commit(job), f"sink commits of job {job.id}")

    async def commit(self, job) -> None:
        """Ask every live worker owing commits to make them, every checkpoint it owes in order."""
        book = self.book(job)
        async with self._lock(job):
            due: dict[str, tuple[list[int], dict]] = {}
            for k in sorted(book.pending):
                for w, parts in book.pending[k].items():
                    ks, merged = due.setdefault(w, ([], {}))
                    ks.append(k)
                    for p, (s, entries) in parts.items():
                        got = merged.setdefault(p, [s, []])
                        have = {e[0] for e in got[1]}
                        got[1].extend(e for e in entries if e[0] not in have)
            live = set(self.workers_of(job))
            calls = [(w, ks, self.link.rpc(w, protocol.SinkCommit(job.id, parts), COMMIT_TIMEOUT))
                     for w, (ks, parts) in due.items() if w in live]
            replies = await asyncio.gather(*(c for _, _, c in calls), return_exceptions=True)
            for (w, ks, _), r in zip(calls, replies, strict=True):
                if isinstance(r, Exception):
                    continue  # a recovery re-drives it (a dead worker), or the next wait_idle does
                if r.get("failed"):
                    msg = f"sink commit failed on {w}: " + "; ".join(f"{p}: {e}" for p, e in r["failed"])
                    book.errors = [*book.errors[-9:], msg]
                    continue
                for k in ks:
                    book.acked(k, w)
        self.changed(job)

    async def settle(self, job) -> bool:
        """For `wait_idle`, the job idle: make every sink commit what the input so far led to; True when done."""
        if job.ckpt.enabled:
            last = job.ckpt.coord.restore_target()
            if last is None or last.boundary < job.tracker.next_chunk:
                if await self.checkpoint(job) is None:
                    return False
            if not self.book(job).settled:
                await self.commit(job)
            return self.book(job).settled
        book = self.book(job)
        book.seq += 1
        workers = self.workers_of(job)
        replies = await asyncio.gather(*(self.link.rpc(w, protocol.SinkFlush(job.id, book.seq),
                                                       COMMIT_TIMEOUT) for w in workers), return_exceptions=True)
        ok = True
        for w, r in zip(workers, replies, strict=True):
            if isinstance(r, Exception) or r.get("failed"):
                ok = False
                why = r if isinstance(r, Exception) else "; ".join(f"{p}: {e}" for p, e in r["failed"])
                book.errors = [*book.errors[-9:], f"sink flush failed on {w}: {why}"]
        return ok

    def recovery(self, job, alive: list[str]) -> dict:
        """The restore message's sink duties, per survivor (clasp.core.sinks.SinkBook.recovery_duties)."""
        if not self.has_sinks(job):
            return {}
        dead = [w for w in job.workers if w not in alive]
        sinks = [o.name for o in job.spec.operators if o.kind == "sink"]
        return self.book(job).recovery_duties(alive, dead, sinks, self.run(job))

    def recovered(self, job, duties: dict, replies: list, alive: list[str]) -> None:
        """Every survivor restored: the commits re-driven are done, but those that failed (still owed)."""
        if not duties:
            return
        book = self.book(job)
        owed: dict[int, dict[str, dict[str, list]]] = {}
        for w, r in zip(alive, replies, strict=True):
            failed = set(r.get("sink_failed") or ())
            for p, s, entries in duties.get(w, {}).get("commit", []):
                if p in failed:
                    owed.setdefault(max(e[0] for e in entries), {}).setdefault(w, {})[p] = [s, entries]
        book.pending = owed

    def unsettled(self, job) -> str | None:
        """Why `wait_idle` still waits on the job's sinks, if it does."""
        if not self.has_sinks(job):
            return None
        book = self.book(job)
        if book.pending:
            last = f": {book.errors[-1]}" if book.errors else ""
            return f"has sink commits of checkpoints {sorted(book.pending)} not acknowledged yet{last}"
        if book.errors:
            return f"has sinks that did not commit: {book.errors[-1]}"
        return None

    def stats(self, job) -> dict | None:
        if not self.has_sinks(job):
            return None
        book = self.book(job)
        return {"commits": book.commits, "owed": sorted(book.pending), "errors": list(book.errors)}
