"""The worker's client of the planner's remote-state server (the paper's Fig. 4 baseline).

`Executor.remote_state` (clasp.runtime.executor) is set to one of these for a job deployed with
`state="remote"`: its stateful operators then read and write their keys here, one `get_many` and one
`put_many` per micro-batch. One
zmq.asyncio DEALER per state-server endpoint, shared by the worker's jobs; requests carry ids, replies
resolve their futures, and a request not answered within `timeout` seconds raises RemoteStateError.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import zmq
import zmq.asyncio

from clasp.core import protocol
from clasp.core.protocol import ProtocolError
from clasp.runtime.net import Pending

log = logging.getLogger("clasp.worker.state")


class RemoteStateError(RuntimeError):
    """The state server refused a request, sent garbage, or did not answer in time."""


class RemoteState:
    """get_many / put_many against the state server at `endpoint`."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, identity: str, timeout: float = 10.0,
                 on_bad=None, security=None):
        self.endpoint = endpoint
        self.timeout = timeout
        self.on_bad = on_bad or (lambda e: None)
        self.sock = ctx.socket(zmq.DEALER)
        if security is not None:
            security.peer(self.sock)
        self.sock.setsockopt(zmq.IDENTITY, identity.encode())
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self._pending = Pending()
        self._reader: asyncio.Task | None = None
        self.requests = 0

    async def get_many(self, job: int, op: str, keys: list) -> dict:
        """{key: state} for those of `keys` that have a state."""
        result = await self._call(protocol.RstateGetMany(job, op, list(keys)))
        if not isinstance(result, dict):
            raise RemoteStateError(f"rstate_get_many: expected a map, got {type(result).__name__}")
        return result

    async def put_many(self, job: int, op: str, states: dict) -> None:
        """Write every key's new state; a state None deletes the key."""
        await self._call(protocol.RstatePutMany(job, op, states))

    async def _call(self, msg: protocol.RstateGetMany | protocol.RstatePutMany):
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read())
        mtype = msg.TYPE
        req, fut = self._pending.open()
        self.requests += 1
        try:
            await self.sock.send(protocol.pack(replace(msg, req=req)))
            reply = await self._pending.wait(req, fut, self.timeout)
        except TimeoutError:
            raise RemoteStateError(f"{mtype}: no answer from the state server {self.endpoint} within "
                                   f"{self.timeout} s") from None
        finally:
            self._pending.close(req)
        if not reply.ok:
            raise RemoteStateError(f"{mtype}: {reply.error}")
        return reply.result

    async def _read(self) -> None:
        while True:
            try:
                frame = await self.sock.recv()
            except zmq.ZMQError:  # the context is being destroyed: the worker stops
                return
            try:
                mtype, msg = protocol.decode_message(frame)
                if mtype == "error":
                    # A refused message whose request id the server could not read: nothing to resolve,
                    # the request times out; say why now.
                    log.warning("state server %s refused a message: %s %s", self.endpoint, msg.reason, msg.detail)
                    continue
                if mtype != "reply":
                    raise ProtocolError("unexpected_type", f"{mtype} from the state server")
            except ProtocolError as e:
                self.on_bad(e)
                continue
            self._pending.resolve(msg.req, msg)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self.sock.close(0)
