"""The host's speed, measured beside a benchmark: how much fixed Python work one CPU-second does right now.

On this shared 2-vCPU VM the same quota-limited run differs by up to 1.5× from one minute to the next
(docs/SIMULATOR.md, runs H–J): a cgroup quota fixes a worker's CPU time, not what the host's core does in
it. The probe runs a fixed unit of interpreter work (msgpack packing and unpacking, dict updates and
string splits: what a worker does per row) in short bursts with sleeps between them, so it takes about
`duty` of one core, and records units per CPU-second of each burst (`time.thread_time`: preemption is not
counted) with the burst's wall time. A run's speed is the mean over the bursts inside its wall-clock
window (`speed_between`); dividing a throughput by it, times a reference speed, removes the host's
drift at the moment of the run (`normalized`).

`SpeedProbe()` starts `python -m bench.speed_probe` (a process of its own, so it does not share the
caller's interpreter lock; one line per burst on its stdout) and `stop()` ends it; `samples()` are
(monotonic time, units per CPU-second) pairs so far (CLOCK_MONOTONIC is the same in every process).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BURST_S = 0.004  # short bursts: the probe's own load stays a small, even share
DUTY = 0.05  # share of one core the probe uses


def _unit() -> None:
    import msgpack

    rows = [("the quick brown fox jumps over the lazy dog", i, i * 0.5) for i in range(20)]
    counts: dict[str, int] = {}
    for r in msgpack.unpackb(msgpack.packb(rows), use_list=False):
        for w in r[0].split():
            counts[w] = counts.get(w, 0) + r[1]


def _loop(burst_s: float, duty: float) -> None:
    sleep_s = burst_s * (1.0 - duty) / duty
    while True:
        t0, c0 = time.monotonic(), time.thread_time()
        units = 0
        while time.monotonic() - t0 < burst_s:
            _unit()
            units += 1
        cpu = time.thread_time() - c0
        if cpu > 0:
            print(f"{(t0 + time.monotonic()) / 2:.6f} {units / cpu:.1f}", flush=True)
        time.sleep(sleep_s)


class SpeedProbe:
    def __init__(self, burst_s: float = BURST_S, duty: float = DUTY):
        # A process of its own (not multiprocessing: no re-import of the caller's __main__), read by a thread.
        self._proc = subprocess.Popen([sys.executable, "-m", "bench.speed_probe", str(burst_s), str(duty)],
                                      stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            t, v = line.split()
            with self._lock:
                self._samples.append((float(t), float(v)))

    def samples(self) -> list[tuple[float, float]]:
        with self._lock:
            return list(self._samples)

    def speed_between(self, start: float, end: float) -> float | None:
        """Mean units per CPU-second of the bursts in [start, end] (monotonic seconds); None if none."""
        return speed_between(self.samples(), start, end)

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5)

    def __enter__(self) -> SpeedProbe:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def speed_between(samples: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """Mean speed of the samples whose time is within [start, end]."""
    xs = [v for t, v in samples if start <= t <= end]
    return statistics.fmean(xs) if xs else None


def normalized(throughput: float, speed: float | None, reference: float | None) -> float:
    """`throughput` as it would be at the `reference` speed: throughput · reference / speed (unchanged
    without both speeds)."""
    if not speed or not reference:
        return throughput
    return throughput * reference / speed


if __name__ == "__main__":
    _loop(float(sys.argv[1]) if len(sys.argv) > 1 else BURST_S, float(sys.argv[2]) if len(sys.argv) > 2 else DUTY)
