"""Synthetic (SYN): ten identical no-op operators in a line, op0 → op1 → ... → op9.

The paper's probe of chained-request cost alone: no state, no work, every request forwarded once.
`chain(n)` is the same app with n operators (`apps.get_app("syn5")`): `clasp.bench.calibrate` runs a shorter
chain beside the ten to tell the cost per chained request from the cost per record.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import clasp

NAME = "syn"
LENGTH = 10


def forward(value: int) -> int:
    return value


def build_dag(length: int = LENGTH, name: str = NAME) -> clasp.Dag:
    dag = clasp.Dag(name)
    ops = [dag.operator(f"op{i}", forward, collect=(i == length - 1)) for i in range(length)]
    for a, b in zip(ops, ops[1:], strict=False):
        a >> b
    return dag


def generate(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1 << 31, size=n).tolist()


def expected(records: list[int]) -> list[int]:
    return sorted(records)


def result(job, length: int = LENGTH) -> list[int]:
    return sorted(job.collected(f"op{length - 1}"))


def chain(length: int) -> SimpleNamespace:
    """SYN with `length` operators, named f"syn{length}", with the app API (clasp/apps/__init__.py)."""
    if length < 1:
        raise ValueError(f"a chain needs at least one operator, not {length}")
    name = f"{NAME}{length}"
    return SimpleNamespace(NAME=name, build_dag=lambda: build_dag(length, name), generate=generate,
                           expected=expected, result=lambda job: result(job, length))
