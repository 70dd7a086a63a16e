"""Key-group ownership from an operator's shares σ_o(w), and the moves between two ownerships.

A stateful operator's key space is hashed into `num_groups` key groups (the runtime uses 128); each
group has one owner worker. Ownership follows the shares by largest remainder, and a reassignment keeps
every group whose owner may stay, so it moves the minimum number of groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from clasp.core.parallelism import largest_remainder

DEFAULT_KEY_GROUPS = 128


def group_counts(shares: Mapping[int, float], num_groups: int) -> dict[int, int]:
    """Key groups per worker: proportional to its share, ≥ 1 for a positive share when there are enough."""
    if num_groups <= 0:
        raise ValueError(f"num_groups must be positive, not {num_groups}")
    bad = {w: s for w, s in shares.items() if not (s >= 0)}
    if bad:
        raise ValueError(f"shares must be non-negative numbers: {bad}")
    workers = sorted(w for w, s in shares.items() if s > 0)
    if not workers:
        raise ValueError("at least one worker needs a positive share")
    minimum = [1] * len(workers) if num_groups >= len(workers) else None
    counts = largest_remainder([shares[w] for w in workers], num_groups, minimum)
    return dict(zip(workers, counts, strict=True))


def assign_key_groups(shares: dict[int, float], num_groups: int,
                      previous: list[int] | None = None) -> list[int]:
    """Owner worker of each key group, proportional to `shares`, moving the fewest groups from `previous`."""
    target = group_counts(shares, num_groups)
    if previous is None or len(previous) != num_groups:
        # Contiguous blocks in worker order: a fresh assignment has no ownership to preserve.
        owners: list[int] = []
        for w in sorted(target):
            owners.extend([w] * target[w])
        return owners
    owners = [-1] * num_groups
    kept = dict.fromkeys(target, 0)
    for g, w in enumerate(previous):
        if w in target and kept[w] < target[w]:
            owners[g] = w
            kept[w] += 1
    free = (g for g in range(num_groups) if owners[g] < 0)
    for w in sorted(target):
        for _ in range(target[w] - kept[w]):
            owners[next(free)] = w
    return owners


def diff_key_groups(old: Sequence[int], new: Sequence[int]) -> dict[tuple[int, int], list[int]]:
    """Moves between two ownerships: (source worker, destination worker) → key groups changing hands."""
    if len(old) != len(new):
        raise ValueError(f"ownerships differ in length: {len(old)} and {len(new)}")
    moves: dict[tuple[int, int], list[int]] = {}
    for g, (a, b) in enumerate(zip(old, new, strict=True)):
        if a != b:
            moves.setdefault((a, b), []).append(g)
    return moves
