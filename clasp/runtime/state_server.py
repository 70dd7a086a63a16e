"""The remote-state server of the paper's Fig. 4 baseline, run by the planner on its own ROUTER port.

With `state="remote"` a job's stateful operators keep no state on the workers: each micro-batch reads its
keys here (`rstate_get_many`) and writes them back (`rstate_put_many`), one round trip each over ZeroMQ.
State is a dict per (job, operator). Every message is validated; a bad one is counted in the planner's
bad-message counter and answered with an `error` (or, when its request id is known, an error reply), so
a worker never waits for an answer to a message that was refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq
import zmq.asyncio

from clasp.core import protocol
from clasp.core.protocol import ProtocolError
from clasp.runtime.net import ServerLoop, bind
from clasp.runtime.security import Security

log = logging.getLogger("clasp.planner.state")

# check(job, op) -> None when the job exists and `op` is one of its stateful operators, else why not.
Check = Callable[[int, str], str | None]


class StateServer:
    """Keyed state per (job, operator), served on a ROUTER. `await serve()` runs until cancelled."""

    def __init__(self, ctx: zmq.asyncio.Context, check: Check, bad: Callable[[ProtocolError], None], security=None):
        self.ctx = ctx
        self.security = security or Security()
        self.check = check
        self.bad = bad
        self.states: dict[tuple[int, str], dict] = {}
        self.counters = {"get_many": 0, "put_many": 0, "keys_read": 0, "keys_written": 0}
        self.endpoint: str | None = None
        self.router: zmq.asyncio.Socket | None = None

    def bind(self, host: str, port: int, advertise: str) -> str:
        """Bind the ROUTER (port 0: a free one); returns the endpoint workers dial."""
        self.router = self.security.server(self.ctx.socket(zmq.ROUTER), "planner_state")
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.router.setsockopt(zmq.RCVHWM, 0)
        self.endpoint = f"tcp://{advertise}:{bind(self.router, host, port)}"
        return self.endpoint

    # ----------------------------------------------------------------- the planner's own view
    def dump(self, job: int, op: str) -> dict:
        """Every key's state of one operator of one job (a copy)."""
        return dict(self.states.get((job, op), {}))

    def drop(self, job: int) -> None:
        """Forget a cancelled job's state."""
        for k in [k for k in self.states if k[0] == job]:
            del self.states[k]

    # ----------------------------------------------------------------- serving
    def _checked(self, msg: protocol.RstateGetMany | protocol.RstatePutMany) -> None:
        why = self.check(msg.job, msg.op)
        if why is not None:
            raise ProtocolError("unknown_job", why)

    def _on_get_many(self, ident: bytes, msg: protocol.RstateGetMany) -> bytes:
        self._checked(msg)
        table = self.states.get((msg.job, msg.op), {})
        self.counters["get_many"] += 1
        self.counters["keys_read"] += len(msg.keys)
        return protocol.reply(msg.req, {k: table[k] for k in msg.keys if k in table})

    def _on_put_many(self, ident: bytes, msg: protocol.RstatePutMany) -> bytes:
        self._checked(msg)
        table = self.states.setdefault((msg.job, msg.op), {})
        for k, v in msg.states.items():
            if v is None:
                table.pop(k, None)
            else:
                table[k] = v
        self.counters["put_many"] += 1
        self.counters["keys_written"] += len(msg.states)
        return protocol.reply(msg.req, True)

    def _failed(self, ident: bytes, mtype: str, msg: protocol.Call, e: Exception) -> bytes:
        """A message refused once its request id is known: counted as bad input, answered with an error
        reply so the asker's request fails now."""
        if not isinstance(e, ProtocolError):
            log.exception("remote state: %s failed", mtype)
            return protocol.reply_error(msg.req, f"{type(e).__name__}: {e}")
        self.bad(e)
        return protocol.reply_error(msg.req, f"{e.reason}: {e.detail}")

    async def serve(self) -> None:
        handlers = {"rstate_get_many": self._on_get_many, "rstate_put_many": self._on_put_many}
        await ServerLoop(self.router, handlers, where="the remote-state server", on_bad=self.bad,
                         on_failure=self._failed, decode=protocol.decode_message, answer_requests=True).serve()
