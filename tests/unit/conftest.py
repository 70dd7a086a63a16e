"""The unit suite runs no planner or worker process: a test that starts one (a `LocalCluster`, `clasp planner`,
`clasp worker`, `clasp cluster`, `clasp run`) fails here, saying it belongs in tests/cluster/. Other processes
(a fresh interpreter, lint-imports) are allowed."""

from __future__ import annotations

import subprocess

import pytest

_CLASP_COMMANDS = {"planner", "worker", "cluster", "run"}
_unit_test_running = False


def _starts_a_clasp_process(argv: list[str]) -> bool:
    for i, a in enumerate(argv):
        if (a == "clasp" and i > 0 and argv[i - 1] == "-m") or a.endswith("/clasp"):
            return argv[i + 1] in _CLASP_COMMANDS if i + 1 < len(argv) else True
    return False


class _Guarded(subprocess.Popen):
    def __init__(self, args, *a, **kw):
        argv = [str(x) for x in args] if isinstance(args, list | tuple) else [str(args)]
        if _unit_test_running and _starts_a_clasp_process(argv):
            raise AssertionError(f"a unit test started a clasp process ({' '.join(argv[:4])} ...): it belongs in "
                                 "tests/cluster/")
        super().__init__(args, *a, **kw)


# Installed for the whole session, armed only while a test of this directory sets up, runs and tears down
# (these hooks are called for this directory's tests only), so a run of both suites is unaffected.
subprocess.Popen = _Guarded


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    global _unit_test_running
    _unit_test_running = True
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    global _unit_test_running
    yield
    _unit_test_running = False

