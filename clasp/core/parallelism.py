"""Operator parallelism from a placement: Eq. (10)–(12) and the integer rounding rules of SPEC.md.

Rounding, in priority order: every placed share (σ_o(w) > 0) gets at least one instance; no worker gets
more than P_max instances unless it hosts more than P_max operators (then each still gets one, since an
operator with no executor could never run there); totals are preserved by largest remainder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def largest_remainder(quotas: Sequence[float], total: int, minimum: Sequence[int] | None = None) -> list[int]:
    """Integers summing to `total`, each ≥ its minimum, apportioned to `quotas` by largest remainder.

    Ties break towards the lower index, so the result is deterministic. Raises ValueError when the
    minimums alone exceed `total`.
    """
    n = len(quotas)
    mins = list(minimum) if minimum is not None else [0] * n
    if len(mins) != n:
        raise ValueError("quotas and minimum differ in length")
    if total < sum(mins):
        raise ValueError(f"total {total} is below the sum of minimums {sum(mins)}")
    if n == 0:
        if total:
            raise ValueError("cannot distribute a non-zero total over nothing")
        return []
    q = [max(0.0, float(x)) if math.isfinite(x) else 0.0 for x in quotas]
    qsum = sum(q)
    if qsum > 0:
        q = [x * total / qsum for x in q]
    else:
        q = [total / n] * n
    alloc = [max(m, math.floor(x)) for x, m in zip(q, mins, strict=True)]
    diff = total - sum(alloc)
    while diff > 0:
        # Most under-served first: the largest remainder q − alloc.
        for i in sorted(range(n), key=lambda i: (-(q[i] - alloc[i]), i))[:diff]:
            alloc[i] += 1
        diff = total - sum(alloc)
    while diff < 0:
        takers = [i for i in range(n) if alloc[i] > mins[i]]
        for i in sorted(takers, key=lambda i: (q[i] - alloc[i], i))[:-diff]:
            alloc[i] -= 1
        diff = total - sum(alloc)
    return alloc


def total_instances(scale: float, current_total: float) -> float:
    """Eq. (10): P_tot = s · P_tot_cur."""
    return scale * current_total


def operator_parallelism(total: int, demand: Mapping[str, float],
                         minimum: Mapping[str, int] | None = None) -> dict[str, int]:
    """Eq. (11): P_o = P_tot · N_o τ̄_o / Σ_o' N_o' τ̄_o', rounded by largest remainder (≥ `minimum[o]`)."""
    names = list(demand)
    mins = [int((minimum or {}).get(o, 0)) for o in names]
    counts = largest_remainder([demand[o] for o in names], max(int(total), sum(mins)), mins)
    return dict(zip(names, counts, strict=True))


def initial_parallelism(demand: Mapping[str, float], p_max: int) -> dict[str, int]:
    """Eq. (12): everything on one worker, P_o = P_max · N_o τ̄_o / Σ N τ̄ (every operator ≥ 1 instance)."""
    return operator_parallelism(p_max, demand, {o: 1 for o in demand})


def distribute(parallelism: Mapping[str, int], fractions: Mapping[str, Mapping[int, float]],
               p_max: int) -> dict[str, dict[int, int]]:
    """Split each P_o over its workers in proportion to φ[o,w], then cap every worker at P_max."""
    result: dict[str, dict[int, int]] = {}
    quota: dict[tuple[str, int], float] = {}
    for o, per_worker in fractions.items():
        workers = sorted(w for w, f in per_worker.items() if f > 0)
        if not workers:
            result[o] = {}
            continue
        p_o = max(int(parallelism.get(o, 0)), len(workers))
        weights = [per_worker[w] for w in workers]
        counts = largest_remainder(weights, p_o, [1] * len(workers))
        wsum = sum(weights)
        for w, wt in zip(workers, weights, strict=True):
            quota[(o, w)] = p_o * wt / wsum
        result[o] = dict(zip(workers, counts, strict=True))
    _cap_workers(result, quota, p_max)
    return result


def _cap_workers(result: dict[str, dict[int, int]], quota: Mapping[tuple[str, int], float],
                 p_max: int) -> None:
    """Move instances off workers above P_max to the same operator on workers with free slots, else drop."""
    used: dict[int, int] = {}
    for per_worker in result.values():
        for w, c in per_worker.items():
            used[w] = used.get(w, 0) + c
    for w in sorted(used):
        while used[w] > p_max:
            candidates = [o for o, pw in result.items() if pw.get(w, 0) > 1]
            if not candidates:
                break  # every operator here already has its single instance
            o = max(candidates, key=lambda o: (result[o][w] - quota[(o, w)], o))
            result[o][w] -= 1
            used[w] -= 1
            spare = [v for v in result[o] if v != w and used[v] < p_max]
            if spare:
                v = max(spare, key=lambda v: (quota[(o, v)] - result[o][v], -v))
                result[o][v] += 1
                used[v] += 1


def placement_parallelism(fractions: Mapping[str, Mapping[int, float]], demand: Mapping[str, float],
                          scale: float, current_total: float, p_max: int) -> dict[str, dict[int, int]]:
    """Eq. (10)–(11) and the distribution over workers: instances of every operator on every worker.

    `current_total` ≤ 0 (nothing running yet) starts from P_max per used worker.
    """
    workers = {w for pw in fractions.values() for w, f in pw.items() if f > 0}
    shares = {o: sum(1 for f in pw.values() if f > 0) for o, pw in fractions.items()}
    if current_total > 0:
        target = total_instances(scale, current_total)
    else:
        target = p_max * max(1, len(workers))
    low = sum(shares.values())
    p_tot = min(max(round(target), low), max(low, p_max * len(workers)))
    per_op = operator_parallelism(p_tot, {o: demand.get(o, 0.0) for o in fractions}, shares)
    return distribute(per_op, fractions, p_max)
