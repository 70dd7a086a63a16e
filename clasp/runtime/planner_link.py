"""The planner's link to its peers over its ROUTER: sends and posted sends, requests to workers with their
replies matched (`rpc`), answers to clients (with the message-size limit), and the planner's background
tasks. The collaborators of `Planner` (sinks, sources, checkpoints, the elastic pool) talk to workers and
clients through this object, not through the planner."""

from __future__ import annotations

import logging
from dataclasses import replace

from clasp.core import protocol
from clasp.core.dag import DagError
from clasp.core.limits import LimitError, check_message
from clasp.core.placement import NoPlacementError
from clasp.core.protocol import ProtocolError
from clasp.core.routing import PlacementError
from clasp.runtime.net import Pending, ServerLoop
from clasp.runtime.security import Security
from clasp.runtime.tasks import ProcessTasks, internal_error

log = logging.getLogger("clasp.planner")


class RequestError(Exception):
    """A client request that cannot be served; the message goes back to the client."""


class NoAnswer(RequestError):
    """A worker did not answer a request in time."""


class WorkerDied(NoAnswer):
    """A worker was declared dead before it answered: once the job recovered, the question may be asked again."""


class PoolError(Exception):
    """A drain that cannot be done (an unknown worker, the last worker of a job): the client sees the text."""


# Failures whose text is meant for the client; any other is a bug here, logged under an error id.
CLIENT_ERRORS = (RequestError, DagError, PlacementError, NoPlacementError, ProtocolError, LimitError, TimeoutError,
                 PoolError)
# Requests of a job that fail with any of its workers' death (the recovery rolls them back anyway).
DYING_REQUESTS = ("migrate_plan", "ckpt_begin", "ckpt_snapshot")


class Link:
    """Sends on the planner's ROUTER (set once bound), its requests awaiting replies, its task group."""

    def __init__(self, security: Security, rpc_timeout: float, tasks: ProcessTasks):
        self.security = security
        self.rpc_timeout = rpc_timeout
        self.tasks = tasks
        self.server: ServerLoop | None = None  # the ROUTER's receive loop, which every send goes through
        self.rpcs = Pending()  # requests to workers awaiting replies: (worker, job, type) each

    def background(self, coro, what: str) -> None:
        """Run a coroutine on its own, owned by the planner's task group; a failure is logged."""
        self.tasks.spawn(coro, what)

    async def send(self, ident: bytes, frame: bytes) -> None:
        self.server.post(ident, frame)

    def post(self, ident: bytes, frame: bytes) -> None:
        """Send without waiting (from a handler that does not await): the ROUTER never blocks a send, and a
        peer that is gone loses it."""
        self.server.post(ident, frame)

    def reply(self, ident, req: int, result) -> None:
        frame = protocol.reply(req, result)
        if len(frame) > self.security.limits.max_message:  # the peer's socket would drop the connection
            try:
                check_message(len(frame), "the answer")
            except LimitError as e:
                self.security.rejected(e.limit)
                frame = protocol.reply_error(req, str(e))
        self.post(ident, frame)

    def reply_error(self, ident, req: int, e: BaseException, mtype: str = "a request") -> None:
        self.post(ident, error_frame(req, e, mtype))

    async def rpc(self, wid: str, msg: protocol.JobCall, timeout: float | None = None) -> object:
        """Ask worker `wid` (`msg`, sent with a request id of its own) and wait for its reply's result;
        raises RequestError on failure or timeout."""
        mtype = msg.TYPE
        req, fut = self.rpcs.open((wid, msg.job, mtype))
        await self.send(wid.encode(), protocol.pack(replace(msg, req=req)))
        try:
            reply = await self.rpcs.wait(req, fut, timeout or self.rpc_timeout)
        except TimeoutError:
            raise NoAnswer(f"worker {wid} did not answer {mtype} within {timeout or self.rpc_timeout} s") from None
        if not reply.ok:
            raise RequestError(f"worker {wid}: {reply.error}")
        return reply.result

    def on_reply(self, ident: bytes, msg: protocol.Reply) -> None:
        self.rpcs.resolve(msg.req, msg)

    def fail_requests_of(self, wid: str, jobs: set[int]) -> None:
        """Worker `wid` died: its requests fail now, and so do the migrations and checkpoint requests of
        `jobs` (its jobs that use checkpoints)."""
        self.rpcs.fail(lambda about: about[0] == wid or (about[1] in jobs and about[2] in DYING_REQUESTS),
                       lambda about: WorkerDied(f"worker {wid} died before it answered {about[2]}"))


def error_frame(req: int, e: BaseException, mtype: str) -> bytes:
    """The answer to request `req` that failed: the error's text when it is meant for the client (a bad
    request), else (a bug here) an error id, the traceback in the planner's log under it."""
    if isinstance(e, RequestError):
        text = str(e)
    elif isinstance(e, CLIENT_ERRORS):
        text = f"{type(e).__name__}: {e}"
    else:
        text = internal_error(log, f"handling {mtype}", e, "the planner log")
    return protocol.reply_error(req, text)
