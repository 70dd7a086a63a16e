"""clasp's benchmarks: each module prints one JSON object (`python -m clasp.bench.NAME --help`)."""

from __future__ import annotations

import json


def emit(result: dict, path: str | None) -> int:
    """Print the result as JSON and, with a path, write it there too; the exit code of a benchmark."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text)
    return 0
