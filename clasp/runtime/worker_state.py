"""The worker's state server: what it answers about its jobs' keyed state, collected outputs and counters.

The same requests arrive on two channels: the worker's ROUTER bound as its state server, which any process
may ask (`serve`), and the control channel from the planner, whose table takes `handlers` as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import zmq.asyncio

from clasp.core import protocol
from clasp.runtime.engine import JobEngine
from clasp.runtime.monitor import Monitor
from clasp.runtime.net import ServerLoop


class StateChannel:
    """`engine_of(body)` finds a request's job engine (or raises OperatorError); `monitor` counts the messages
    each job sent and received, part of its counters; `pending_timer(job)`: the earliest processing-time
    deadline not fired yet of the job's timers held here (None: none)."""

    def __init__(self, engine_of: Callable[[dict], JobEngine], monitor: Monitor,
                 pending_timer: Callable[[int], float | None] = lambda job: None):
        self.engine_of, self.monitor, self.pending_timer = engine_of, monitor, pending_timer
        self.handlers = {"state_get": self.on_state_get, "state_put": self.on_state_put,
                         "state_dump": self.on_state_dump, "collected_dump": self.on_collected_dump,
                         "counters": self.on_counters}

    async def serve(self, router: zmq.asyncio.Socket, *, on_bad: Callable, on_failure: Callable) -> None:
        await ServerLoop(router, self.handlers, where="a state server", pass_ident=False,
                         on_bad=on_bad, on_failure=on_failure).serve()

    def on_state_dump(self, body) -> bytes:
        return protocol.reply(body["req"], self.engine_of(body).state_dump(body["op"]))

    def on_collected_dump(self, body) -> bytes:
        return protocol.reply(body["req"], list(self.engine_of(body).op(body["op"]).collected))

    def on_counters(self, body) -> bytes:
        eng = self.engine_of(body)
        out = {**eng.counters(), "messages": self.monitor.message_counts(eng.job)}
        if body.get("below") is not None:
            out["holds_below"] = eng.holds_below(body["below"])
        if body.get("timers"):  # after any firing's seal on the same channel: its outputs are counted first
            out["timers"] = self.pending_timer(eng.job)
        return protocol.reply(body["req"], out)

    def on_state_get(self, body) -> bytes:
        op = self.engine_of(body).op(body["op"])
        op.warm_key(body["key"])
        return protocol.reply(body["req"], op.get(body["key"]))

    def on_state_put(self, body) -> bytes:
        self.engine_of(body).op(body["op"]).put_state(body["key"], body["value"])
        return protocol.reply(body["req"], True)
