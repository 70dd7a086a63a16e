"""Draws docs/layers.svg, the layer picture of docs/ARCHITECTURE.md: `.venv/bin/python docs/layers.py`.

The layers and their order are those of the import-linter contract in pyproject.toml (`make lint`)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: a small, diffable SVG
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

# (row from the top, [(package, what it holds)]); boxes in one row are independent of each other.
ROWS = [
    [("clasp.cli", "the `clasp` command: planner, worker, cluster, run, place, simulate, bench")],
    [("clasp.bench", "the paper's figures and the runtime's benchmarks, on both engines")],
    [("clasp.local", "processes on this machine:\ncluster, netns, cpulimit"),
     ("clasp.sim", "the simulator\n+ cost files (package data)"),
     ("clasp.apps", "the seven apps, on the\npublic API only")],
    [("clasp.runtime", "asyncio + ZeroMQ shells: planner, worker + job engine, state server, client, driver,\n"
                       "one task group per process (tasks)")],
    [("clasp.core", "pure: dag, protocol, routing, tracking, model, estimator, placement, parallelism,\n"
                    "keygroups, control, migration, profiles, scheduler,"
                    " policies/ (base, clasp, baselines, registry)")],
]
COLOURS = ["#f4cccc", "#fce5cd", "#d9ead3", "#cfe2f3", "#d9d2e9"]


def main() -> None:
    fig, ax = plt.subplots(figsize=(10, 6.4))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, len(ROWS) * 1.25 + 0.3)
    ax.axis("off")
    for r, row in enumerate(ROWS):
        y = (len(ROWS) - 1 - r) * 1.25 + 0.3
        width = (9.6 - 0.2 * (len(row) - 1)) / len(row)
        for i, (name, text) in enumerate(row):
            x = 0.2 + i * (width + 0.2)
            ax.add_patch(FancyBboxPatch((x, y), width, 0.9, boxstyle="round,pad=0.02", fc=COLOURS[r], ec="#444"))
            ax.text(x + width / 2, y + 0.66, name, ha="center", va="center", fontsize=12, weight="bold",
                    family="monospace")
            ax.text(x + width / 2, y + 0.3, text, ha="center", va="center", fontsize=8.5)
        if r < len(ROWS) - 1:
            ax.annotate("", xy=(9.85, y - 0.33), xytext=(9.85, y + 0.02),
                        arrowprops={"arrowstyle": "->", "color": "#444"})
    ax.text(5, len(ROWS) * 1.25 + 0.15, "each layer imports only the layers below it; boxes side by side do not "
            "import each other", ha="center", fontsize=9.5, style="italic")
    ax.text(5, 0.05, "clasp/__init__.py and clasp/testing.py are the public API (Dag, connect, run_local)",
            ha="center", fontsize=8.5)
    out = Path(__file__).resolve().parent / "layers.svg"
    fig.savefig(out, bbox_inches="tight", metadata={"Date": None})
    print(out)


if __name__ == "__main__":
    main()
