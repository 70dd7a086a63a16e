"""Synthetic (SYN): ten identical no-op operators in a line, op0 → op1 → ... → op9.

The paper's probe of chained-request cost alone: no state, no work, every request forwarded once.
"""

from __future__ import annotations

import numpy as np

import clasp

NAME = "syn"
LENGTH = 10


def forward(value: int) -> int:
    return value


def build_dag() -> clasp.Dag:
    dag = clasp.Dag(NAME)
    ops = [dag.operator(f"op{i}", forward, collect=(i == LENGTH - 1)) for i in range(LENGTH)]
    for a, b in zip(ops, ops[1:], strict=False):
        a >> b
    return dag


def generate(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1 << 31, size=n).tolist()


def expected(records: list[int]) -> list[int]:
    return sorted(records)


def result(job) -> list[int]:
    return sorted(job.collected(f"op{LENGTH - 1}"))
