"""One task group per process: every task it starts is kept until it ends, and cancelled with the rest.

`asyncio.create_task` without a reference lets the loop drop a running task, and nothing cancels
such tasks at shutdown; an exception in one is reported only when it is garbage collected. A process
(planner, worker) starts each task through its `ProcessTasks` instead: `run(*loops)` runs its main
loops until one ends (its exception ends the process), `spawn(coro, what)` runs a background task
whose failure is logged with its traceback, and both are cancelled together when `run` returns.
`asyncio.TaskGroup` would cancel the whole process when one background task fails; this one does not.

`internal_error` gives an unexpected exception in a request handler an error id: the traceback goes to
the process's log under that id, the client gets the id and not the internals.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any


class ProcessTasks:
    """The tasks of one process (`log`: where failures of background tasks go)."""

    def __init__(self, log: logging.Logger):
        self.log = log
        self.tasks: set[asyncio.Future] = set()
        self.closed = False

    def __len__(self) -> int:
        return len(self.tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Future:
        """Run `coro` in the background, owned by this group; a failure is logged as "`what` failed"."""
        task = asyncio.ensure_future(coro)
        if self.closed:  # shutting down: nothing new starts
            task.cancel()
            return task
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, what))
        return task

    def _done(self, task: asyncio.Future, what: str) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.error("%s failed", what, exc_info=task.exception())

    async def run(self, *loops: Coroutine[Any, Any, Any],
                  also: Callable[[], Iterable[asyncio.Future]] | None = None) -> None:
        """Run the process's main loops until one ends or fails (that ends the process: its exception
        propagates), then cancel every task of the group and wait for them; `also()`: more tasks owned
        elsewhere (a job engine's operator tasks) to cancel with them, asked at shutdown."""
        main = [asyncio.ensure_future(c) for c in loops]
        self.tasks.update(main)
        try:
            await asyncio.gather(*main)
        finally:
            await self.close(also() if also else ())

    async def close(self, also: Iterable[asyncio.Future] = ()) -> None:
        """Cancel every task of the group (and `also`), and wait until all have ended."""
        self.closed = True
        tasks = [*self.tasks, *also]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Whether `event` is set within `seconds`. Not `asyncio.wait_for`: on Python 3.11 it swallows a
    cancellation that comes as the event is set, and a task cancelled then would run on."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


def internal_error(log: logging.Logger, what: str, e: BaseException, where: str) -> str:
    """Log `e` with its traceback under a new error id; returns the text for the client, naming the
    id and the log to look in (`where`, e.g. "the planner log")."""
    eid = f"e-{uuid.uuid4().hex[:8]}"
    log.error("%s: %s failed", eid, what, exc_info=e)
    return f"internal error {eid}; see {where}"
