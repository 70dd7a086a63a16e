"""The planner's side of sinks (clasp.core.sinks), mixed into `Planner`.

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

from clasp.core.sinks import SinkBook, run_token

log = logging.getLogger("clasp.planner")
COMMIT_TIMEOUT = 60.0


class PlannerSinkMixin:
    def _sink_book(self, job) -> SinkBook:
        books = self.__dict__.setdefault("_sink_books", {})
        book = books.get(job.id)
        if book is None:
            book = books[job.id] = SinkBook()
        return book

    def _sink_lock(self, job) -> asyncio.Lock:
        return self.__dict__.setdefault("_sink_locks", {}).setdefault(job.id, asyncio.Lock())

    @staticmethod
    def _has_sinks(job) -> bool:
        return any(o.kind == "sink" for o in job.spec.operators)

    @staticmethod
    def _sink_run(job) -> str:
        return run_token(job.id, job.created)

    def _sinks_completed(self, job, ckpt: int, replies: list) -> None:
        """Checkpoint `ckpt` is complete (its COMPLETE.json written): its partitions may commit."""
        if not self._has_sinks(job):
            return
        todo = self._sink_book(job).completed(ckpt, {r["worker"]: r.get("sinks") or {} for r in replies})
        if todo:
            self._background(self._sink_commit(job), f"sink commits of job {job.id}")

    async def _sink_commit(self, job) -> None:
        """Ask every live worker owing commits to make them, every checkpoint it owes in order."""
        book = self._sink_book(job)
        async with self._sink_lock(job):
            due: dict[str, tuple[list[int], dict]] = {}
            for k in sorted(book.pending):
                for w, parts in book.pending[k].items():
                    ks, merged = due.setdefault(w, ([], {}))
                    ks.append(k)
                    for p, (s, entries) in parts.items():
                        got = merged.setdefault(p, [s, []])
                        have = {e[0] for e in got[1]}
                        got[1].extend(e for e in entries if e[0] not in have)
            live = set(self._job_workers(job))
            calls = [(w, ks, self.rpc(w, "sink_commit", {"job": job.id, "parts": parts}, COMMIT_TIMEOUT))
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
        self._check_waiters(job)

    async def _sinks_settle(self, job) -> bool:
        """For `wait_idle`, the job idle: make every sink commit what the input so far led to; True when done."""
        if job.ckpt is not None:
            last = job.ckpt.coord.restore_target()
            if last is None or last.boundary < job.tracker.next_chunk:
                if await self._checkpoint(job) is None:
                    return False
            if not self._sink_book(job).settled:
                await self._sink_commit(job)
            return self._sink_book(job).settled
        book = self._sink_book(job)
        book.seq += 1
        workers = self._job_workers(job)
        replies = await asyncio.gather(*(self.rpc(w, "sink_flush", {"job": job.id, "seq": book.seq}, COMMIT_TIMEOUT)
                                         for w in workers), return_exceptions=True)
        ok = True
        for w, r in zip(workers, replies, strict=True):
            if isinstance(r, Exception) or r.get("failed"):
                ok = False
                why = r if isinstance(r, Exception) else "; ".join(f"{p}: {e}" for p, e in r["failed"])
                book.errors = [*book.errors[-9:], f"sink flush failed on {w}: {why}"]
        return ok

    def _sinks_recovery(self, job, alive: list[str]) -> dict:
        """The restore message's sink duties, per survivor (clasp.core.sinks.SinkBook.recovery_duties)."""
        if not self._has_sinks(job):
            return {}
        dead = [w for w in job.workers if w not in alive]
        sinks = [o.name for o in job.spec.operators if o.kind == "sink"]
        return self._sink_book(job).recovery_duties(alive, dead, sinks, self._sink_run(job))

    def _sinks_recovered(self, job, duties: dict, replies: list, alive: list[str]) -> None:
        """Every survivor restored: the commits re-driven are done, but those that failed (still owed)."""
        if not duties:
            return
        book = self._sink_book(job)
        owed: dict[int, dict[str, dict[str, list]]] = {}
        for w, r in zip(alive, replies, strict=True):
            failed = set(r.get("sink_failed") or ())
            for p, s, entries in duties.get(w, {}).get("commit", []):
                if p in failed:
                    owed.setdefault(max(e[0] for e in entries), {}).setdefault(w, {})[p] = [s, entries]
        book.pending = owed

    def _sinks_unsettled(self, job) -> str | None:
        """Why `wait_idle` still waits on the job's sinks, if it does."""
        if not self._has_sinks(job):
            return None
        book = self._sink_book(job)
        if book.pending:
            last = f": {book.errors[-1]}" if book.errors else ""
            return f"has sink commits of checkpoints {sorted(book.pending)} not acknowledged yet{last}"
        if book.errors:
            return f"has sinks that did not commit: {book.errors[-1]}"
        return None

    def sink_stats(self, job) -> dict | None:
        if not self._has_sinks(job):
            return None
        book = self._sink_book(job)
        return {"commits": book.commits, "owed": sorted(book.pending), "errors": list(book.errors)}
