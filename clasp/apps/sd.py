"""Spike Detection (SD): moving-average★ → spike-detect.

Keeps a moving window of the last WINDOW temperature readings per sensor id and flags a reading that
deviates from its window's mean by more than THRESHOLD of it. The answer depends on the order of each
sensor's readings (the window), so a correct run proves per-key order.
"""

from __future__ import annotations

import numpy as np

import clasp

NAME = "sd"
WINDOW = 10
THRESHOLD = 0.25
SENSORS = 200


def moving_average(state: dict | None, r: dict) -> tuple[dict, dict]:
    # State is [count, window] so the final state also checks how many readings each sensor saw.
    n, window = (state["n"], state["w"]) if state else (0, [])
    window.append(r["temp"])
    if len(window) > WINDOW:
        del window[0]
    avg = sum(window) / len(window)
    return {"n": n + 1, "w": window}, {"sensor": r["sensor"], "seq": r["seq"], "temp": r["temp"], "avg": avg}


def spike_detect(r: dict) -> list | None:
    if abs(r["temp"] - r["avg"]) > THRESHOLD * r["avg"]:
        return [[r["sensor"], r["seq"], r["temp"], r["avg"]]]
    return None


def sensor_key(r: dict) -> int:
    return r["sensor"]


def build_dag() -> clasp.Dag:
    dag = clasp.Dag(NAME)
    avg = dag.operator("moving_average", moving_average, stateful=True, key=sensor_key)
    avg >> dag.operator("spike_detect", spike_detect, collect=True)
    return dag


def generate(n: int, seed: int) -> list[dict]:
    """`n` readings from SENSORS sensors, interleaved at random, seq counting per sensor from 0.

    Each sensor drifts around its own base temperature; ~1% of readings are spikes of +40..+100%.
    """
    rng = np.random.default_rng(seed)
    sensor = rng.integers(0, SENSORS, size=n)
    base = rng.uniform(15.0, 35.0, size=SENSORS)
    temp = base[sensor] + rng.normal(0.0, 0.8, size=n)
    spikes = rng.random(n) < 0.01
    temp = np.where(spikes, temp * rng.uniform(1.4, 2.0, size=n), temp)
    seqs = np.zeros(SENSORS, dtype=np.int64)
    out = []
    for s, t in zip(sensor.tolist(), np.round(temp, 3).tolist(), strict=True):
        out.append({"sensor": s, "seq": int(seqs[s]), "temp": t})
        seqs[s] += 1
    return out


def expected(records: list[dict]) -> dict:
    """The spikes and the final windows, by a plain loop over the readings in order."""
    windows: dict[int, list[float]] = {}
    counts: dict[int, int] = {}
    spikes = []
    for r in records:
        w = windows.setdefault(r["sensor"], [])
        w.append(r["temp"])
        if len(w) > WINDOW:
            w.pop(0)
        counts[r["sensor"]] = counts.get(r["sensor"], 0) + 1
        avg = sum(w) / len(w)
        if abs(r["temp"] - avg) > THRESHOLD * avg:
            spikes.append([r["sensor"], r["seq"], r["temp"], avg])
    return {"spikes": sorted(spikes), "windows": {s: {"n": counts[s], "w": w} for s, w in windows.items()}}


def result(job) -> dict:
    return {"spikes": sorted(list(x) for x in job.collected("spike_detect")),
            "windows": dict(job.state("moving_average"))}
