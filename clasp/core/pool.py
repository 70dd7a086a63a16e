"""The elastic worker pool's decisions, pure: how many workers the cluster should have, which to give back.

The planner asks a provider (`clasp.runtime.providers`) for workers and gives idle ones back; what it
asks for is decided here, from plain data, with no clock of its own (the caller passes `now`):

- **more**: a job's control loop (or `job.scale(n)`) decided on more workers than the job's pool has. The
  pool wish is then the largest such demand over the jobs, at most `max_workers`;
- **fewer**: a worker that holds nothing of any job (no operator share, no key group) for `cooldown`
  seconds is given back, newest first, as long as at least `min_workers` (and every pending demand) remain.

`PoolWish` is what the planner hands the provider: the number of workers the cluster should have and the
workers to stop. Workers named in `release` are leaving: no placement uses them any more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PoolConfig:
    """`min_workers`..`max_workers` bound what the planner asks for (`max_workers` None: the pool is the
    workers that happen to be registered, today's `static` behaviour, and nothing is released);
    `cooldown` is how long a worker must hold nothing before it is given back; `join_timeout` how long a
    decision waits for the workers it asked for before it makes do with those that came."""

    min_workers: int = 1
    max_workers: int | None = None
    cooldown: float = 10.0
    join_timeout: float = 30.0

    @property
    def elastic(self) -> bool:
        return self.max_workers is not None


@dataclass(frozen=True)
class PoolWish:
    """What the planner asks the provider for: `workers` in total, and `release` (ids) stopped."""

    workers: int
    release: tuple[str, ...] = ()
    reason: str = ""

    def to_wire(self) -> dict:
        return {"workers": self.workers, "release": list(self.release), "reason": self.reason}


@dataclass
class PoolState:
    """The planner's memory between ticks: since when each worker holds nothing; the pending demands."""

    idle_since: dict[str, float] = field(default_factory=dict)
    demands: dict[int, int] = field(default_factory=dict)  # job id -> workers it waits for


def max_pool(config: PoolConfig, live: int) -> int:
    """The most workers a job's policy may plan for: the provider's ceiling, or the live pool when static."""
    if config.max_workers is None:
        return max(1, live)
    return max(1, config.max_workers, live)


def demand(config: PoolConfig, needed: int, live: int) -> int | None:
    """Workers to ask the provider for when a decision needs `needed` and `live` are there; None: none
    (enough are there, or the provider cannot grow). Never more than `max_workers`."""
    if needed <= live or config.max_workers is None:
        return None
    return min(needed, max(config.max_workers, live))


def update_idle(state: PoolState, live: Sequence[str], busy: Iterable[str], now: float) -> None:
    """Track since when each live worker holds nothing of any job (`busy`: those that hold something)."""
    busy = set(busy)
    state.idle_since = {w: state.idle_since.get(w, now) for w in live if w not in busy}


def pool_wish(config: PoolConfig, state: PoolState, live: Sequence[str], now: float,
              order: Mapping[str, float] | None = None) -> PoolWish:
    """The wish for this tick. `live`: the registered workers not leaving, in registration order;
    `order`: a rank per worker, highest released first (default: the newest registered first)."""
    n = len(live)
    want = max(state.demands.values(), default=0)
    if config.max_workers is None:
        return PoolWish(n, (), "static pool")
    floor = max(config.min_workers, want)
    if want > n:
        target = min(want, max(config.max_workers, n))
        return PoolWish(target, (), f"a job needs {want} workers, {n} are there")
    if n < config.min_workers:
        return PoolWish(config.min_workers, (), f"below --min-workers {config.min_workers}")
    rank = order if order is not None else {w: i for i, w in enumerate(live)}
    idle = [w for w in live if w in state.idle_since and now - state.idle_since[w] >= config.cooldown]
    idle.sort(key=lambda w: -rank.get(w, 0))
    release = tuple(idle[:max(0, n - floor)])
    if release:
        return PoolWish(n - len(release), release, f"{len(release)} worker(s) held nothing for "
                        f"{config.cooldown:g} s")
    return PoolWish(n, (), "steady")
