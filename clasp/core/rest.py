"""Putting key groups to rest in idle time (docs/SCALING.md): when the worker's input has paused, and how much
CPU time the packing may take. Pure: the caller passes the clock."""

from __future__ import annotations

REST_IDLE_S = 0.05  # the worker without work this long: its input paused, not a gap between two requests
REST_SHARE = 0.05  # of the wall clock, the most that putting state to rest costs on average
REST_BURST_S = 0.25  # of CPU time: how much packing one pause may do at once (a few 100k keys)


class RestBudget:
    """How much CPU time putting key groups to rest may take: a token bucket filled at REST_SHARE of the
    wall clock up to REST_BURST_S, so a job whose input stops and starts again and again (each pause
    repacking what the last burst changed) spends at most REST_SHARE of a core on it. Pure: the caller
    passes the clock."""

    def __init__(self, now: float, share: float = REST_SHARE, burst: float = REST_BURST_S):
        self.share, self.burst = share, burst
        self.level, self.at = burst, now

    def _fill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.at) * self.share)
        self.at = now

    def allows(self, now: float) -> bool:
        self._fill(now)
        return self.level > 0

    def spend(self, cpu_s: float) -> None:
        self.level -= cpu_s

    def ready_at(self, now: float) -> float:
        """When `allows` becomes true again."""
        self._fill(now)
        return now if self.level > 0 else now + (1e-6 - self.level) / self.share


def idle_work_at(busy_at: float, now: float, moved: bool, changed: bool, budget: RestBudget) -> float | None:
    """When the worker's idle-time work may start, its input paused (`REST_IDLE_S` after its last work at
    `busy_at`): freeing the state of key groups that moved away or decoding migrated ones (`moved`) then;
    putting changed key groups to rest (`changed`) then too, once `budget` allows. None: nothing to do."""
    if moved:
        return busy_at + REST_IDLE_S
    if changed:
        return max(busy_at + REST_IDLE_S, budget.ready_at(now))
    return None
