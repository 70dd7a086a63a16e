"""The package's shape (docs/ARCHITECTURE.md, "Layers"): a pure core, no import cycles, the layer contract."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

grimp = pytest.importorskip("grimp")  # the dev extra (import-linter brings it)

ROOT = Path(__file__).resolve().parents[2]

# Importing every module of clasp.core in a fresh interpreter must not pull in the event loop, sockets or
# processes: the core is what can be tested, and reused, without any of them.
_PURITY = """
import importlib, json, pkgutil, sys
import clasp.core
for m in pkgutil.walk_packages(clasp.core.__path__, "clasp.core."):
    importlib.import_module(m.name)
loaded = sorted(n for n in ("asyncio", "zmq", "subprocess", "uvloop", "prometheus_client") if n in sys.modules)
print(json.dumps({"modules": sorted(n for n in sys.modules if n.startswith("clasp")), "loaded": loaded}))
"""


def test_the_core_imports_no_asyncio_zmq_or_subprocess():
    out = subprocess.run([sys.executable, "-c", _PURITY], capture_output=True, text=True, check=True, cwd=ROOT)
    got = json.loads(out.stdout)
    assert "clasp.core.policies.registry" in got["modules"] and "clasp.core.dag" in got["modules"]
    assert not [m for m in got["modules"] if m.startswith(("clasp.runtime", "clasp.local", "clasp.cli"))]
    assert got["loaded"] == []


def test_no_module_level_import_cycle():
    graph = grimp.build_graph("clasp")
    g = nx.DiGraph()
    for m in graph.modules:
        for imported in graph.find_modules_directly_imported_by(m):
            g.add_edge(m, imported)
    assert list(nx.simple_cycles(g)) == []


def test_public_api_is_unchanged():
    import clasp

    # Added since the restructure: AuthError, a failed CURVE handshake (docs/SECURITY.md); identity, the key
    # function of an operator keyed by the value itself (README, "Semantics").
    assert set(clasp.__all__) == {"Dag", "DagError", "Operator", "connect", "ClaspError", "ClaspTimeout",
                                  "PlannerUnavailable", "AuthError", "identity"}
    assert all(getattr(clasp, n) for n in clasp.__all__)
    from clasp.testing import run_local  # noqa: F401  (the in-process runner is public too)


@pytest.mark.skipif(shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None,
                    reason="import-linter (the dev extra) is not installed")
def test_layer_contracts_are_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    out = subprocess.run([exe, "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
