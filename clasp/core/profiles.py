"""Input-rate profiles for the workload driver, as pure functions of time (no clock, no I/O).

Accepted forms (rates in records/s, durations in s):
- `unthrottled`: push as fast as the runtime accepts;
- `constant:RATE`;
- `burst`: stages alternating between a low level (10-30% of the reference max rate) and a high one
  (70-100%), each level drawn uniformly from its range, each stage 5-10 s (paper §5.6);
- `gradual`: 10%, 20%, ..., 100%, 90%, ..., 10% of the max rate, each stage 5-10 s (19 stages);
- `steps:R1@S1,R2@S2,...`: rate R1 for S1 seconds, then R2 for S2 seconds, ...

Burst and gradual are seeded: the same (max_rate, seed) gives the same stages. Their total volumes are
equal: gradual is drawn first; burst draws stage kinds, durations and levels until its volume reaches
gradual's, then moves every level linearly inside its own range (towards the range's bottom if it
overshot, its top if it fell short) by the one factor that makes Σ rate·seconds equal gradual's volume.
Stage kinds and durations are untouched and every level stays inside its range, so the result is still
a burst profile in the paper's sense. The stage count tried is the first whose drawn volume reaches
gradual's, or the one before it; one of them admits the target once 7 or more stages precede the last
(each widens the attainable range by ≥ 0.2·max·5 s, together more than one stage's 0.7·max·10 s floor),
and a gradual volume (≥ 50·max) always needs at least 5 stages; should neither fit, more are drawn.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

ACCEPTED = ("unthrottled, constant:RATE, burst, gradual, steps:R1@S1,R2@S2,... "
            "(RATE and R in records/s > 0, S in seconds > 0)")
BURST_LOW = (0.10, 0.30)
BURST_HIGH = (0.70, 1.00)
STAGE_SECONDS = (5, 10)
GRADUAL_LEVELS = [i / 10 for i in range(1, 11)] + [i / 10 for i in range(9, 0, -1)]


class ProfileError(ValueError):
    """A profile string that cannot be used; the message is one line naming the problem."""


@dataclass(frozen=True)
class Profile:
    """A piecewise-constant rate: `stages` is [(rate, seconds)], rate None meaning unthrottled."""

    kind: str
    stages: tuple[tuple[float | None, float], ...]

    @property
    def unthrottled(self) -> bool:
        return any(r is None for r, _ in self.stages)

    @property
    def duration(self) -> float:
        """Total seconds; math.inf for a profile given no duration (constant or unthrottled)."""
        return sum(d for _, d in self.stages)

    @property
    def volume(self) -> int | None:
        """Records the whole profile pushes (rounded); None when unthrottled or endless."""
        if self.unthrottled or math.isinf(self.duration):
            return None
        return round(sum(r * d for r, d in self.stages))

    def rate_at(self, t: float) -> float | None:
        """The target rate at second `t` from the start: None if unthrottled, 0.0 after the end."""
        if t < 0:
            return 0.0
        for r, d in self.stages:
            if t < d:
                return r
            t -= d
        return 0.0

    def sent_by(self, t: float) -> float:
        """Records the profile has pushed by second `t` (∫ rate); a driver sends floor() of it."""
        if self.unthrottled:
            raise ProfileError("an unthrottled profile has no schedule to integrate")
        total = 0.0
        for r, d in self.stages:
            if t <= 0:
                break
            step = min(t, d)
            total += r * step
            t -= step
        return total

    def scaled(self, duration: float) -> Profile:
        """The same shape stretched or squeezed in time to last `duration` seconds (rates unchanged)."""
        if not duration > 0 or math.isinf(duration):
            raise ProfileError(f"duration must be a positive finite number of seconds, not {duration!r}")
        if math.isinf(self.duration):
            return Profile(self.kind, tuple((r, float(duration)) for r, _ in self.stages[:1]))
        f = duration / self.duration
        return Profile(self.kind, tuple((r, d * f) for r, d in self.stages))


def _error(problem: str) -> ProfileError:
    return ProfileError(f"{problem}; accepted profiles: {ACCEPTED}")


def _positive(text: str, what: str, profile: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise _error(f"malformed profile {profile!r}: {what} {text!r} is not a number") from None
    if not v > 0 or math.isinf(v):
        raise _error(f"profile {profile!r}: {what} must be > 0 and finite, got {text!r}")
    return v


def gradual_stages(max_rate: float, seed: int) -> list[tuple[float, float]]:
    rng = random.Random(f"gradual:{seed}")
    return [(lv * max_rate, float(rng.randint(*STAGE_SECONDS))) for lv in GRADUAL_LEVELS]


def burst_stages(max_rate: float, seed: int, volume: float) -> list[tuple[float, float]]:
    """Burst stages whose Σ rate·seconds equals `volume` (see the module docstring for how)."""
    rng = random.Random(f"burst:{seed}")
    ranges: list[tuple[float, float]] = []
    drawn: list[tuple[float, float]] = []
    high = rng.random() < 0.5
    total = 0.0
    while True:
        lo, hi = BURST_HIGH if high else BURST_LOW
        rate, secs = rng.uniform(lo, hi) * max_rate, float(rng.randint(*STAGE_SECONDS))
        ranges.append((lo * max_rate, hi * max_rate))
        drawn.append((rate, secs))
        total += rate * secs
        high = not high
        if total < volume:
            continue
        if len(drawn) > 10_000:
            raise ProfileError(f"cannot build a burst profile of volume {volume!r}")
        # Try the stage count just reached, then one fewer: the first whose [min, max] volume holds it.
        for k in (len(drawn), len(drawn) - 1):
            if k == 0:
                continue
            vmin = sum(ranges[i][0] * drawn[i][1] for i in range(k))
            vmax = sum(ranges[i][1] * drawn[i][1] for i in range(k))
            if not vmin <= volume <= vmax:
                continue
            cur = sum(r * d for r, d in drawn[:k])
            if cur >= volume:
                f = (cur - volume) / (cur - vmin) if cur > vmin else 0.0
                return [(r - (r - ranges[i][0]) * f, d) for i, (r, d) in enumerate(drawn[:k])]
            f = (volume - cur) / (vmax - cur)
            return [(r + (ranges[i][1] - r) * f, d) for i, (r, d) in enumerate(drawn[:k])]


def parse_profile(text: str, max_rate: float | None = None, seed: int = 0,
                  duration: float | None = None) -> Profile:
    """Parse a profile string (forms in ACCEPTED) into a Profile.

    `max_rate` is the reference maximum rate (records/s) that burst and gradual levels are fractions of;
    `duration`, if given, bounds unthrottled and constant profiles (otherwise they are endless).
    """
    if not isinstance(text, str) or not text.strip():
        raise _error(f"empty profile {text!r}")
    spec = text.strip()
    name, _, arg = spec.partition(":")
    name = name.strip().lower()
    length = float("inf") if duration is None else float(duration)
    if duration is not None and (not length > 0):
        raise _error(f"duration must be > 0 seconds, got {duration!r}")
    if name in ("burst", "gradual"):
        if arg:
            raise _error(f"malformed profile {spec!r}: {name} takes no argument")
        if max_rate is None or not max_rate > 0 or math.isinf(max_rate):
            raise _error(f"profile {name!r} needs a reference max rate > 0, got {max_rate!r}")
        grad = gradual_stages(float(max_rate), seed)
        if name == "gradual":
            return Profile(name, tuple(grad))
        return Profile(name, tuple(burst_stages(float(max_rate), seed, sum(r * d for r, d in grad))))
    if name == "unthrottled":
        if arg:
            raise _error(f"malformed profile {spec!r}: unthrottled takes no argument")
        return Profile(name, ((None, length),))
    if name == "constant":
        if not arg:
            raise _error(f"malformed profile {spec!r}: constant needs a rate, as constant:RATE")
        return Profile(name, ((_positive(arg, "rate", spec), length),))
    if name == "steps":
        if not arg:
            raise _error(f"malformed profile {spec!r}: steps needs R1@S1,R2@S2,...")
        stages = []
        for part in arg.split(","):
            r, at, s = part.strip().partition("@")
            if not at:
                raise _error(f"malformed profile {spec!r}: step {part.strip()!r} is not RATE@SECONDS")
            stages.append((_positive(r.strip(), "rate", spec), _positive(s.strip(), "duration", spec)))
        return Profile(name, tuple(stages))
    raise _error(f"unknown profile {spec!r}")
