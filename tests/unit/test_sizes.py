"""Size limits that keep the shells readable (docs/ARCHITECTURE.md, "Sizes"): the planner keeps the wiring
and the message table, the engine and the worker theirs, their collaborators own the rest; no runtime module
or class anywhere grows past the limits."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "clasp" / "runtime"

PLANNER_METHODS = 30
PLANNER_LINES = 500
CLASS_METHODS = 35
MODULE_LINES = 700


def _classes(path: Path):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
            yield node, methods, node.end_lineno - node.lineno + 1


def _sources():
    return sorted((ROOT / "clasp").rglob("*.py"))


def test_the_planner_keeps_the_wiring_only():
    (planner, methods, lines), = [c for c in _classes(RUNTIME / "planner.py") if c[0].name == "Planner"]
    # Its collaborators are objects passed in, not mixins whose methods it would inherit.
    assert not planner.bases, [ast.unparse(b) for b in planner.bases]
    assert methods <= PLANNER_METHODS, f"Planner has {methods} methods"
    assert lines <= PLANNER_LINES, f"Planner has {lines} lines"


def test_no_runtime_module_over_its_limit():
    over = {}
    for path in sorted(RUNTIME.glob("*.py")):
        n = len(path.read_text().splitlines())
        if n > MODULE_LINES:
            over[path.name] = n
    assert not over, f"runtime modules over {MODULE_LINES} lines: {over}"


def test_no_class_over_its_limit():
    over = {}
    for path in _sources():
        for node, methods, _ in _classes(path):
            if methods > CLASS_METHODS:
                over[f"{path.relative_to(ROOT)}:{node.name}"] = methods
    assert not over, f"classes over {CLASS_METHODS} methods: {over}"


# The collaborators of the planner, the worker and the job engine, and what none of them may hold.
COLLABORATORS = {"planner": [*sorted(RUNTIME.glob("planner_*.py")), RUNTIME / "elastic.py"],
                 "worker": [RUNTIME / n for n in ("worker_migration.py", "worker_state.py", "worker_recovery.py",
                                                  "worker_sources.py", "worker_time.py", "sinks.py")],
                 "engine": [RUNTIME / n for n in ("executor.py", "outbox.py", "barrier.py", "worker_migration.py")]}


def test_no_collaborator_reaches_back_through_any():
    """The planner's, the worker's and the engine's collaborators get what they use at construction; none holds
    its owner, and none types what it holds as `Any` to reach around an import."""
    for owner, paths in COLLABORATORS.items():
        for path in paths:
            tree = ast.parse(path.read_text())
            aliases = [ast.unparse(n) for n in tree.body if isinstance(n, ast.Assign)
                       and isinstance(n.value, ast.Name) and n.value.id == "Any"]
            assert not aliases, f"{path.name}: {aliases}"
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                init = next((b for b in cls.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
                if init is not None and cls.name != "PlannerCollector":  # a read-only view, built at serve()
                    args = init.args.args + init.args.kwonlyargs
                    names = [a.arg for a in args]
                    assert owner not in names and f"{owner}s" not in names, f"{path.name}:{cls.name} takes the {owner}"
                    typed_any = [a.arg for a in args if a.annotation is not None and ast.unparse(a.annotation) == "Any"]
                    assert not typed_any, f"{path.name}:{cls.name}: {typed_any}"


def test_the_worker_and_the_engine_keep_their_collaborators_apart():
    """Collaborators passed in, not mixed in: neither the engine nor the worker has a base class."""
    (engine, _, _), = [c for c in _classes(RUNTIME / "engine.py") if c[0].name == "JobEngine"]
    (worker, _, _), = [c for c in _classes(RUNTIME / "worker.py") if c[0].name == "Worker"]
    assert not engine.bases
    assert not worker.bases, [ast.unparse(b) for b in worker.bases]
