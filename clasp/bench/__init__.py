"""clasp's benchmarks, one package: the paper's figures (`clasp bench FIG`), the runtime's own benchmarks, the
simulator's calibration and validation, and the peer benchmark against Bytewax (`peers/`). Each module is run as
`python -m clasp.bench.NAME --help` and prints JSON; this module owns what they share (`emit`, `cpu_seconds`)."""

from __future__ import annotations

import json
import math
import os


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (Linux); NaN once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def emit(result: dict, path: str | None, unprinted: tuple[str, ...] = ()) -> int:
    """Print the result as JSON (but the `unprinted` keys, such as every run's row) and, with a path, write
    all of it there too; the exit code of a benchmark."""
    print(json.dumps({k: v for k, v in result.items() if k not in unprinted}, indent=2))
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
    return 0
