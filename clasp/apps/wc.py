"""Word Count (WC): split → count★. Counts the occurrences of every word of a text stream."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np

import clasp

NAME = "wc"
# Zipf(s) over VOCAB ranks, still unsaturated at the sizes we run: 300,000 lines of 10-20 words reach
# ~40,000 distinct words (the paper's WC state size at migration time), 100,000 lines ~21,000.
VOCAB = 200_000
ZIPF_S = 1.45
_CONS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiouy"
_SYLLABLES = [c + v for c in _CONS for v in _VOWELS] + [c + v + "n" for c in _CONS for v in _VOWELS]
_PUNCT = ".,;:!?"


def _word(rank: int) -> str:
    # Distinct pronounceable strings by rank (base-len(_SYLLABLES) digits), so the vocabulary is stable.
    n = len(_SYLLABLES)
    out = [_SYLLABLES[rank % n]]
    rank //= n
    while rank:
        out.append(_SYLLABLES[rank % n])
        rank //= n
    return "".join(out)


@functools.cache
def _vocabulary() -> tuple[np.ndarray, np.ndarray]:
    # Built on first use so that importing the app (planner, workers) stays cheap.
    words = np.array([_word(r) for r in range(VOCAB)], dtype=object)
    cdf = np.cumsum(1.0 / np.arange(1, VOCAB + 1, dtype=np.float64) ** ZIPF_S)
    return words, cdf / cdf[-1]


def tokenize(line: str) -> list[str]:
    """Words of a line: whitespace-split, trailing punctuation stripped, lower-cased."""
    return [w.strip(_PUNCT).lower() for w in line.split()]


def split(line: str) -> list[str]:
    return [w for w in tokenize(line) if w]


def count(state: int | None, word: str) -> tuple[int, None]:
    return (state or 0) + 1, None


def build_dag() -> clasp.Dag:
    dag = clasp.Dag(NAME)
    dag.operator("split", split) >> dag.operator("count", count, stateful=True, key=clasp.identity)
    return dag


def generate(n: int, seed: int) -> list[str]:
    """`n` sentences of 10-20 Zipf-distributed words, capitalized and ending in a period."""
    vocab, cdf = _vocabulary()
    rng = np.random.default_rng(seed)
    lengths = rng.integers(10, 21, size=n)
    ranks = np.minimum(np.searchsorted(cdf, rng.random(int(lengths.sum()))), VOCAB - 1)
    words = vocab[ranks].tolist()
    lines = []
    pos = 0
    for ln in lengths.tolist():
        w = words[pos:pos + ln]
        pos += ln
        w[0] = w[0].capitalize()
        lines.append(" ".join(w) + ".")
    return lines


def expected(records: list[str]) -> dict[str, int]:
    c: Counter[str] = Counter()
    for line in records:
        c.update(w for w in tokenize(line) if w)
    return dict(c)


def result(job) -> dict[str, int]:
    return dict(job.state("count"))
