"""Key-group ownership from an operator's shares σ_o(w), and the moves between two ownerships.

A stateful operator's key space is hashed into `num_groups` key groups (the runtime uses 128); each
group has one owner worker. Ownership follows the shares by largest remainder, and a reassignment keeps
every group whose owner may stay, so it moves the minimum number of groups. With measured per-group
weights (the requests each group received), ownership follows the shares by weight instead: a worker
with share σ owns groups carrying about σ of the requests, so a hot group is not simply one of its
owner's σ·128 groups (beyond the paper, whose model assumes a uniform key space).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from clasp.core.parallelism import largest_remainder


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
                      previous: list[int] | None = None, weights: Sequence[float] | None = None) -> list[int]:
    """Owner worker of each key group, proportional to `shares`, moving the fewest groups from `previous`;
    with `weights` (one per group), proportional by weight (`assign_weighted`)."""
    if weights is not None and len(weights) == num_groups and sum(weights) > 0:
        return assign_weighted(shares, weights, previous)
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


def assign_weighted(shares: dict[int, float], weights: Sequence[float],
                    previous: Sequence[int] | None = None) -> list[int]:
    """Owners such that each worker's groups carry about its share of the total weight: a previous owner
    keeps a group (heaviest first) while that keeps it within its target, then the rest go heaviest first
    to the worker furthest below its target (LPT). Groups never seen weigh 1 % of a mean group, so they
    spread too; every worker with a share owns at least one group when there are enough."""
    n = len(weights)
    workers = sorted(w for w, s in shares.items() if s > 0)
    if not workers:
        raise ValueError("at least one worker needs a positive share")
    total_share = sum(shares[w] for w in workers)
    floor = 0.01 * sum(weights) / n
    weight = [max(float(v), 0.0) + floor for v in weights]
    total = sum(weight)
    target = {w: shares[w] / total_share * total for w in workers}
    load = dict.fromkeys(workers, 0.0)
    owners = [-1] * n
    heaviest = sorted(range(n), key=lambda g: -weight[g])
    if previous is not None and len(previous) == n:
        for g in heaviest:
            w = previous[g]
            if w in load and load[w] + weight[g] <= target[w] * (1 + 1e-9) + 0.5 * weight[g]:
                owners[g] = w
                load[w] += weight[g]
    for g in heaviest:
        if owners[g] < 0:
            w = max(workers, key=lambda x: (target[x] - load[x], -x))
            owners[g] = w
            load[w] += weight[g]
    if n >= len(workers):
        count = {w: owners.count(w) for w in workers}
        for w in workers:
            if count[w] == 0:  # take the lightest group of the worker holding most
                donor = max(workers, key=lambda x: count[x])
                g = min((g for g in range(n) if owners[g] == donor), key=lambda g: weight[g])
                owners[g] = w
                count[donor] -= 1
                count[w] = 1
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
