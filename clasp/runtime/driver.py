"""The workload driver: push an app's input at a rate profile, sample the paper's metrics every second.

Two layers. The pure core (`due`, `target_between`, `Series`, `summarize`) decides how many records are
due at a given moment and turns per-second samples into a summary; it needs no cluster and is what the
unit tests exercise. `Driver` is the loop around a `clasp.runtime.client.Job`: every `tick` seconds it pushes,
in one `push()` call, the records the profile has made due since the last tick (so a late tick catches
up instead of drifting), and once a second it reads the planner's per-second series from
`job.stats()`. The planner measures input rate, throughput (records completed end to end), latency
percentiles of the records completed in that second and the workers in use; the driver keeps those
samples, adds the rate the profile asked for, and at the end waits for the job to go idle and compares
the app's answer with the expected one for exactly the records it sent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from clasp.core.profiles import Profile

TICK = 0.025
# An unthrottled push hands the planner this many records per call: enough to keep its window of
# chunks full, few enough that the driver still samples the series about once a second.
UNTHROTTLED_BATCH = 20_000
# A throttled push is capped so that a driver that fell behind still samples between catch-up pushes.
MAX_PUSH = 50_000


# ----------------------------------------------------------------------------- pure core
def due(profile: Profile, elapsed: float, sent: int, total: int) -> int:
    """How many of `total` records should have been pushed `elapsed` seconds into the profile.

    Throttled: floor of the profile's integral, so rounding never accumulates. Unthrottled: one more
    batch beyond `sent` while the profile lasts. Never less than `sent`, never more than `total`.
    """
    if profile.unthrottled:
        if elapsed >= profile.duration:
            return sent
        return min(total, sent + UNTHROTTLED_BATCH)
    if elapsed >= profile.duration:
        # The profile's volume is its integral rounded: the last push sends the fraction floor() kept back.
        return max(sent, min(total, round(profile.sent_by(profile.duration))))
    return max(sent, min(total, math.floor(profile.sent_by(max(elapsed, 0.0)) + 1e-9)))


def finished(profile: Profile, elapsed: float, sent: int, total: int) -> bool:
    """True once every record is sent or the profile is over (its last records included)."""
    return sent >= total or elapsed >= profile.duration


def target_between(profile: Profile, t0: float, t1: float) -> float | None:
    """The mean rate (records/s) the profile asks for over [t0, t1]; None when unthrottled."""
    if profile.unthrottled:
        return None
    if t1 <= t0:
        return profile.rate_at(t0)
    return (profile.sent_by(max(t1, 0.0)) - profile.sent_by(max(t0, 0.0))) / (t1 - t0)


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


@dataclass
class Series:
    """Per-second samples, one per planner tick, de-duplicated by the planner's timestamp.

    `offset` is how many seconds after the job's creation the driver started pushing: the planner
    stamps samples from job creation, the profile counts from the first push.
    """

    profile: Profile
    offset: float = 0.0
    rows: list[dict] = field(default_factory=list)
    _last_t: float = -math.inf

    def add(self, entries: Sequence[dict]) -> list[dict]:
        """Take the planner's series entries (seconds, its field names); returns the rows that were new."""
        new = []
        for e in entries:
            t = float(e["t"])
            if t <= self._last_t:
                continue
            prev = self._last_t if self.rows else t - 1.0
            self._last_t = t
            target = target_between(self.profile, prev - self.offset, t - self.offset)
            row = {"t": round(t, 3), "target_rate": target, "input_rate": float(e.get("input_rate", 0.0)),
                   "throughput": float(e.get("throughput", 0.0)), "queue": int(e.get("queue", 0)),
                   "inflight": int(e.get("inflight", 0)), "p50_ms": _ms(e.get("p50")),
                   "p95_ms": _ms(e.get("p95")), "p99_ms": _ms(e.get("p99")),
                   "workers": int(e.get("workers", 0))}
            self.rows.append(row)
            new.append(row)
        return new


def summarize(rows: Sequence[dict], *, records: int, completed: int | None = None,
              elapsed: float | None = None, latency: dict | None = None, correct: bool | None = None,
              **extra: Any) -> dict:
    """The run's summary from its per-second rows.

    Mean and max throughput are over the seconds from the first to the last one that completed
    anything (start-up and the idle tail would dilute the mean). `latency` is the planner's cumulative
    histogram summary in seconds (exact over every record); without it the percentiles are the
    worst per-second ones, an upper bound.
    """
    busy = [i for i, r in enumerate(rows) if r["throughput"] > 0]
    active = rows[busy[0]:busy[-1] + 1] if busy else []
    tput = [r["throughput"] for r in active]
    workers = [r["workers"] for r in rows if r["workers"] > 0]
    if latency and latency.get("count"):
        lat = {k: _ms(latency.get(k)) for k in ("p50", "p95", "p99")}
    else:
        lat = {k: max((r[f"{k}_ms"] for r in rows if r[f"{k}_ms"] is not None), default=None)
               for k in ("p50", "p95", "p99")}
    if elapsed is None:
        elapsed = rows[-1]["t"] - rows[0]["t"] + 1.0 if rows else 0.0
    out = {
        "duration_s": round(elapsed, 3),
        "records": records,
        "completed": completed,
        "records_per_s": (completed / elapsed) if completed and elapsed else None,
        "throughput_mean": sum(tput) / len(tput) if tput else 0.0,
        "throughput_max": max(tput, default=0.0),
        "latency_ms": lat,
        "workers_min": min(workers, default=0),
        "workers_max": max(workers, default=0),
        "seconds": len(rows),
        "correct": correct,
    }
    out.update(extra)
    return out


# ----------------------------------------------------------------------------- the loop
class DriveError(RuntimeError):
    """The job did not finish (not idle in time); the partial summary is on the driver."""


class Driver:
    """Drives one submitted job. `run()` returns the summary; after an interrupt, `summary()` still works.

    `on_sample(row, driver)` is called for every new per-second row (the live progress line);
    `should_stop()` is polled every tick (a caller's stop flag).
    """

    def __init__(self, job, app: ModuleType, records: list, profile: Profile, *, tick: float = TICK,
                 drain_timeout: float = 120.0, submitted_at: float | None = None,
                 on_sample: Callable[[dict, Driver], None] | None = None, check: bool = True):
        self.job = job
        self.app = app
        self.records = records
        self.profile = profile
        self.tick = tick
        self.drain_timeout = drain_timeout
        self.submitted_at = submitted_at
        self.on_sample = on_sample
        self.check = check
        self.series = Series(profile)
        self.sent = 0
        self.started: float | None = None
        self.push_done: float | None = None
        self.idle_at: float | None = None
        self.final: dict | None = None
        self.correct: bool | None = None
        self.error: str | None = None
        self._last_poll = -math.inf
        self.recoveries = 0

    # -- sampling
    def poll(self, force: bool = False) -> dict | None:
        now = time.monotonic()
        if not force and now - self._last_poll < 1.0:
            return None
        self._last_poll = now
        st = self.job.stats()
        self.recoveries = (st.get("checkpoints") or {}).get("recoveries", 0)  # the live line shows them
        for row in self.series.add(st.get("series", [])):
            if self.on_sample is not None:
                self.on_sample(row, self)
        return st

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    # -- phases
    def push_all(self) -> None:
        total = len(self.records)
        self.started = time.monotonic()
        if self.submitted_at is not None:
            self.series.offset = self.started - self.submitted_at
        next_tick = self.started
        while True:
            el = time.monotonic() - self.started
            target = due(self.profile, el, self.sent, total)
            if target > self.sent:
                upto = min(target, self.sent + MAX_PUSH)
                self.job.push(self.records[self.sent:upto])
                self.sent = upto
            if finished(self.profile, el, self.sent, total) and self.sent >= target:
                break
            self.poll()
            if not self.profile.unthrottled:
                next_tick += self.tick
                pause = next_tick - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                else:
                    next_tick = time.monotonic()  # fell behind: the next due() catches up in one push
        self.push_done = time.monotonic()

    def drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout
        while True:
            st = self.job.stats()
            done = st["completed"] + st.get("lost", 0) >= self.sent
            if st["outstanding"] == 0 and st["queued"] == 0 and done:
                break
            if time.monotonic() > deadline:
                self.error = (f"job not idle {self.drain_timeout:.0f} s after the last push: "
                              f"{st['outstanding']} records in flight, {st['queued']} queued")
                raise DriveError(self.error)
            self.poll()
            time.sleep(0.05)
        self.job.wait_idle(self.drain_timeout)
        self.idle_at = time.monotonic()
        # One more planner tick so the last second's completions and latencies are in the series.
        time.sleep(1.05)
        self.final = self.poll(force=True)

    def verify(self) -> bool:
        sent = self.records[:self.sent]
        self.correct = bool(self.app.result(self.job) == self.app.expected(sent))
        return self.correct

    def run(self) -> dict:
        self.push_all()
        self.drain()
        if self.check:
            self.verify()
        return self.summary()

    def summary(self, interrupted: bool = False) -> dict:
        end = self.idle_at or time.monotonic()
        elapsed = (end - self.started) if self.started is not None else 0.0
        final = self.final or {}
        extra: dict[str, Any] = {"sent": self.sent, "push_s": round(self.push_done - self.started, 3)
                                 if self.push_done and self.started else None}
        if final:
            extra.update(failed=final.get("failed", 0), lost=final.get("lost", 0),
                         errors=list(final.get("errors", []))[:5])
        if interrupted:
            extra["interrupted"] = True
        if self.error:
            extra["error"] = self.error
        return summarize(self.series.rows, records=len(self.records), completed=final.get("completed"),
                         elapsed=elapsed, latency=final.get("latency"), correct=self.correct, **extra)
