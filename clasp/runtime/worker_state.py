"""The worker's state server: what it answers about its jobs' keyed state, collected outputs and counters.

The same requests arrive on two channels: the worker's ROUTER bound as its state server, which any process
may ask (`serve`), and the control channel from the planner, whose table takes `handlers` as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import msgpack
import zmq.asyncio

from clasp.core import protocol
from clasp.runtime.engine import JobEngine
from clasp.runtime.monitor import Monitor
from clasp.runtime.net import ServerLoop


class StateChannel:
    """`engine_of(msg)` finds a request's job engine (or raises OperatorError); `monitor` counts the messages
    each job sent and received, part of its counters; `pending_timer(job)`: the earliest processing-time
    deadline not fired yet of the job's timers held here (None: none)."""

    def __init__(self, engine_of: Callable[[protocol.JobCall], JobEngine], monitor: Monitor,
                 pending_timer: Callable[[int], float | None] = lambda job: None):
        self.engine_of, self.monitor, self.pending_timer = engine_of, monitor, pending_timer
        self.handlers = {"state_get": self.on_state_get, "state_put": self.on_state_put,
                         "state_dump": self.on_state_dump, "state_packed": self.on_state_packed,
                         "collected_dump": self.on_collected_dump,
                         "counters": self.on_counters}

    async def serve(self, router: zmq.asyncio.Socket, *, on_bad: Callable, on_failure: Callable) -> None:
        await ServerLoop(router, self.handlers, where="a state server", pass_ident=False, on_bad=on_bad,
                         on_failure=on_failure, decode=protocol.decode_message, answer_requests=True).serve()

    def on_state_dump(self, msg: protocol.StateDump) -> bytes:
        return protocol.reply(msg.req, self.engine_of(msg).state_dump(msg.op))

    def on_state_packed(self, msg: protocol.StatePacked) -> bytes:
        return protocol.reply(msg.req, self.engine_of(msg).state_packed(msg.op))

    def on_collected_dump(self, msg: protocol.CollectedDump) -> bytes:
        """The outputs as one packed array (bytes in the reply): the planner splices them into its answer."""
        return protocol.reply(msg.req, msgpack.packb(self.engine_of(msg).op(msg.op).collected, use_bin_type=True))

    def on_counters(self, msg: protocol.Counters) -> bytes:
        eng = self.engine_of(msg)
        out = {**eng.counters(), "messages": self.monitor.message_counts(eng.job)}
        if msg.below is not None:
            out["holds_below"] = eng.holds_below(msg.below)
        if msg.timers:  # after any firing's seal on the same channel: its outputs are counted first
            out["timers"] = self.pending_timer(eng.job)
        return protocol.reply(msg.req, out)

    def on_state_get(self, msg: protocol.StateGet) -> bytes:
        op = self.engine_of(msg).op(msg.op)
        op.warm_key(msg.key)
        return protocol.reply(msg.req, op.get(msg.key))

    def on_state_put(self, msg: protocol.StatePut) -> bytes:
        self.engine_of(msg).op(msg.op).put_state(msg.key, msg.value)
        return protocol.reply(msg.req, True)
