"""An in-process planner: a handler's bug gives the client an error id and the log its traceback, the
planner keeps serving, and every task of the process ends with it."""

from __future__ import annotations

import asyncio
import logging
import re
import threading

import pytest

import clasp
from clasp.runtime.client import ClaspError
from clasp.runtime.config import PlannerConfig
from clasp.runtime.planner import Planner, RequestError
from clasp.runtime.planner_migration import Migrations
from clasp.runtime.planner_queries import JobQueries
from clasp.runtime.tasks import ProcessTasks
from tests.conftest import wait_for


class InProcessPlanner:
    """A Planner served by an event loop on a thread of this process."""

    def __init__(self, **kw):
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._main, kwargs=kw, daemon=True)
        self.thread.start()
        assert self.started.wait(10), "the planner did not start"
        wait_for(lambda: getattr(self.planner, "endpoint", None), what="the planner's endpoint")

    def _main(self, **kw):
        asyncio.set_event_loop(self.loop)
        self.planner = Planner(PlannerConfig(**kw))
        self.task = self.loop.create_task(self.planner.serve())
        self.loop.call_soon(self.started.set)
        try:
            self.loop.run_until_complete(self.task)
        except asyncio.CancelledError:
            pass
        finally:
            self.loop.close()

    def stop(self):
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_a_handlers_bug_gives_the_client_an_error_id_and_the_log_a_traceback(monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger="clasp.planner")

    def broken_autoscale(self, ident, body):
        return {}["no such key"]  # a KeyError: a bug, not a bad request

    async def broken_collected(self, ident, body):
        await asyncio.sleep(0)
        raise TypeError("internal detail the client must not see")

    def refused(self, ident, body):
        raise RequestError("a message meant for the client")

    # The handler table is built from the planner's collaborators' methods when serve() starts.
    monkeypatch.setattr(Migrations, "on_autoscale", broken_autoscale)
    monkeypatch.setattr(JobQueries, "on_collected", broken_collected)
    monkeypatch.setattr(JobQueries, "on_stats", refused)
    p = InProcessPlanner()
    try:
        with clasp.connect(p.planner.endpoint) as client:
            ids = []
            for call in (lambda: client._call("autoscale", {"job": 1, "enabled": True}),
                         lambda: client._call("collected", {"job": 1, "op": "x"})):
                with pytest.raises(ClaspError) as e:
                    call()
                m = re.fullmatch(r"internal error (e-[0-9a-f]{8}); see the planner log", str(e.value))
                assert m, str(e.value)
                assert "no such key" not in str(e.value) and "internal detail" not in str(e.value)
                ids.append(m.group(1))
            with pytest.raises(ClaspError, match="^a message meant for the client$"):
                client._call("stats", {"job": 1})
            # Still serving: a handler that works answers.
            assert client.workers() == [] and client.jobs() == []
        logged = {r.getMessage().split(":")[0]: r for r in caplog.records if r.name == "clasp.planner"}
        assert set(ids) <= set(logged)
        assert logged[ids[0]].exc_info[0] is KeyError and logged[ids[1]].exc_info[0] is TypeError
        assert "handling autoscale failed" in logged[ids[0]].getMessage()
        assert "handling collected failed" in logged[ids[1]].getMessage()
    finally:
        p.stop()


def test_every_task_of_the_planner_is_cancelled_when_it_stops():
    p = InProcessPlanner()
    started = threading.Event()

    async def forever():
        started.set()
        await asyncio.sleep(3600)

    holder = []

    def spawn():  # on the planner's loop
        holder.append(p.planner.tasks.spawn(forever(), "a long task"))
        holder.append(list(p.planner.tasks.tasks))  # the main loops (recv, dispatch, tick, ...) and this one

    p.loop.call_soon_threadsafe(spawn)
    assert started.wait(10)
    running = holder[1]
    assert len(running) >= 5 and holder[0] in running and not any(t.done() for t in running)
    p.stop()
    assert all(t.done() for t in running) and holder[0].cancelled() and len(p.planner.tasks) == 0


async def test_background_failures_are_logged_and_closed_groups_start_nothing(caplog):
    tasks = ProcessTasks(logging.getLogger("clasp.test"))

    async def boom():
        raise RuntimeError("kaput")

    t = tasks.spawn(boom(), "the boom task")
    await asyncio.gather(t, return_exceptions=True)
    await asyncio.sleep(0)
    assert len(tasks) == 0
    record = next(r for r in caplog.records if r.getMessage() == "the boom task failed")
    assert record.exc_info[0] is RuntimeError
    await tasks.close()
    late = tasks.spawn(asyncio.sleep(10), "too late")
    await asyncio.sleep(0)
    assert late.cancelled() and len(tasks) == 0
