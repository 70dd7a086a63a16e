"""Socket helpers shared by the planner, the workers and the client, and the one server loop
(`ServerLoop`: receive, decode and validate, dispatch, reply or error) with its reply matching
(`Pending`) that every request-serving socket of the runtime goes through."""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import os
import signal
import socket
from collections.abc import Callable

import zmq

from clasp.core import protocol
from clasp.core.protocol import ProtocolError


def bind(sock: zmq.Socket, host: str, port: int) -> int:
    """Bind `sock` to tcp://host:port (port 0: a free one) and return the port bound."""
    if port == 0:
        return sock.bind_to_random_port(f"tcp://{host}")
    sock.bind(f"tcp://{host}:{port}")
    return port


def advertised(host: str, advertise: str | None) -> str:
    """The address peers should dial: --advertise, or the bind host unless it is a wildcard."""
    if advertise:
        return advertise
    if host in ("0.0.0.0", "*", "::", ""):
        return socket.gethostbyname(socket.gethostname())
    return host


def start_metrics_server(registry, host: str, port: int, advertise: str, app=None, ready=None) -> str:
    """Serve `registry` at http://host:port/metrics in a thread; returns the URL to scrape.

    `app(metrics_app)`, if given, is the WSGI app served instead, which passes /metrics to `metrics_app`
    (the planner's dashboard, `clasp.runtime.dashboard`). In front of either, the probes for Kubernetes
    (deploy/kubernetes.yaml): `/healthz` (the process answers: 200) and `/readyz` (200 once `ready()` is
    true, e.g. a worker registered with the planner; else 503)."""
    import threading
    from wsgiref.simple_server import make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    metrics = make_wsgi_app(registry)
    inner = metrics if app is None else app(metrics)

    def probes(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok = path == "/healthz" or ready is None or bool(ready())
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"not ready\n"]
        return inner(environ, start_response)

    server = make_server(host, port, probes, Server, handler_class=_SilentHandler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return f"http://{advertise}:{server.server_port}/metrics"


# pyzmq copies a frame below its copy threshold (64 KB) even with copy=False; a 30 KB copy costs ~30 µs
# here against ~6 µs to hand the buffer over, so data sockets hand over anything above ZERO_COPY_BYTES.
ZERO_COPY_BYTES = 8192
# The hot path allocates a container per request (row tuples, decoded batches): at CPython's default
# young-generation threshold (700) the collector runs every few hundred requests and, through its
# older generations, re-scans the queues; cycles are rare here, so collect 100 times less often.
GC_THRESHOLDS = (70_000, 20, 20)


def batch_io_threads(ctx: zmq.Context) -> zmq.Context:
    """`ctx` with its I/O threads under SCHED_BATCH (call before its first socket). A send wakes the I/O
    thread; under the default policy the woken thread preempts the sender, and on a busy host the sender
    then waits for a slice: an isolated send took 40-50 µs at the median and 0.6-1.4 ms on average here,
    against 20-40 µs and 40-110 µs with batch I/O threads (docs/results-log.md, "Remote path")."""
    if hasattr(os, "SCHED_BATCH"):
        ctx.set(zmq.THREAD_SCHED_POLICY, os.SCHED_BATCH)
        ctx.set(zmq.THREAD_PRIORITY, 0)
    return ctx


def zero_copy(sock: zmq.Socket) -> zmq.Socket:
    """`sock` with sends above ZERO_COPY_BYTES handed to libzmq without a copy (send(copy=False))."""
    sock.copy_threshold = ZERO_COPY_BYTES
    return sock


class DirectSend:
    """An asyncio socket's sends without a future per frame: libzmq takes the frame at once (NOBLOCK) on
    a shadow of the same socket, and only a frame libzmq would block on (or fail) goes through the asyncio
    send, queued in order. pyzmq's asyncio send costs ~6 µs a frame here against ~1 µs for the direct one
    (docs/RUNTIME.md, "Frames without futures"). Only for a socket that nobody receives on with asyncio:
    a direct send can take the socket's edge-triggered wake-up from an awaited receive, which then never
    wakes. Every send on the socket must go through this object, so that no direct frame overtakes one
    waiting in the asyncio queue."""

    __slots__ = ("sock", "raw", "queued")

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.raw = zmq.Socket.shadow(sock.underlying)
        self.raw.copy_threshold = sock.copy_threshold
        self.queued: asyncio.Future | None = None

    def send(self, frame, copy: bool = True) -> asyncio.Future | None:
        """Send one frame; returns None when libzmq has it, else the asyncio send's future (await it to
        wait for room, as `await sock.send` would)."""
        q = self.queued
        if q is None or q.done():
            try:
                self.raw.send(frame, zmq.NOBLOCK, copy=copy)
                return None
            except zmq.ZMQError:  # no room (Again) or a failure: the asyncio send queues it or reports it
                pass
        self.queued = q = self.sock.send(frame, copy=copy)
        return q

    def close(self, linger: int | None = None) -> None:
        self.sock.close(linger=linger)


# Frames taken with one wake-up of a receive loop: the first awaited, the rest read without a future while
# libzmq has them, so a busy receiver pays one asyncio receive per burst, not per frame (~12 µs each here).
DRAIN_FRAMES = 64
# As plain ints: pyzmq's enum members cost a Python call per `&` on the hot path.
NOBLOCK, EVENTS, POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)


def _received(raw: zmq.Socket) -> list:
    """One message's frames, queued already (NOBLOCK): a frame above ZERO_COPY_BYTES as a view of libzmq's
    memory, not a copy. A push is a megabyte that the planner only checks, logs and sends on in pieces: its
    copy out of libzmq, into pages just allocated, cost 0.1-0.45 ms a push (a few µs as a view)."""
    frames = []
    while True:
        f = raw.recv(NOBLOCK, copy=False)
        frames.append(f.buffer if len(f) > ZERO_COPY_BYTES else f.bytes)
        if not f.more:
            return frames


def drained(raw: zmq.Socket, limit: int = DRAIN_FRAMES) -> list:
    """Up to `limit` frames already queued on `raw` (a shadow socket), not waiting: zmq.Frame objects (their
    memory, not a copy). Call it from the one loop that receives on the socket, between its awaited receives
    (the next one checks the socket's events before it waits, so nothing read here leaves it asleep), and
    only on a socket whose asyncio sends never wait for room (PULL, or a ROUTER: their sends never block)."""
    out = []
    try:
        for _ in range(limit):
            out.append(raw.recv(zmq.NOBLOCK, copy=False))
    except zmq.Again:
        pass
    return out


def run(main_coro_factory, on_term=None) -> int:
    """Run an async main under uvloop, stopping it cleanly on SIGINT/SIGTERM (`on_term`: called on SIGTERM
    instead, e.g. a worker's graceful drain). The main's return value is the exit code."""
    import uvloop

    gc.freeze()  # what the process imported and built so far is never garbage: no collection scans it
    gc.set_threshold(*GC_THRESHOLDS)

    async def _main():
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        loop.add_signal_handler(signal.SIGINT, task.cancel)
        loop.add_signal_handler(signal.SIGTERM, task.cancel if on_term is None else on_term)
        try:
            return await main_coro_factory()
        except asyncio.CancelledError:
            return 0

    return uvloop.run(_main()) or 0


def setup_logging(name: str, level: str = "INFO") -> logging.Logger:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format=f"%(asctime)s {name} %(levelname)s %(message)s")
    return logging.getLogger(name)


class ServerLoop:
    """One socket's server: each message is received, checked (its envelope, then `decode`, then a handler
    for its type), handed to its handler, and the handler's answer (bytes) sent back to the asker. Bad input
    is given to `on_bad` (which counts it in the process's bad-message metric) and answered with an `error`
    message; a failing handler is given to `on_failure`, whose frame (if any) answers it.

    `routed`: a ROUTER (frames: the asker's identity, one payload frame; handlers take `(ident, body)`), else
    a DEALER (handlers take `(body)`; `pass_ident=False` gives a ROUTER's handlers that too). A handler may
    return a coroutine: with `spawn`, it is handed to `spawn(ident, mtype, body, coro)` so the loop keeps
    receiving; without, it is awaited in order. `raw`
    names message types whose handler also takes the payload frame. `admit(ident, mtype, body, frame)` may
    refuse a checked message before its handler by raising. `drain`: no future per message; each wake-up takes
    every message libzmq holds, and every send on the socket goes through `post` (see `_serve_drained`).
    `answer_requests`: a bad message whose request id could be read is answered with an error `reply` to that
    request (its asker fails now, not at a timeout)."""

    def __init__(self, sock: zmq.Socket, handlers: dict[str, Callable], *, where: str,
                 on_bad: Callable[[ProtocolError], None],
                 on_failure: Callable[[bytes | None, str, object, Exception], bytes | None],
                 decode: Callable = protocol.decode, routed: bool = True, spawn: Callable | None = None,
                 raw: frozenset[str] = frozenset(), admit: Callable | None = None, drain: bool = False,
                 pass_ident: bool | None = None, answer_requests: bool = False):
        self.sock, self.handlers, self.where = sock, handlers, where
        self.on_bad, self.on_failure, self.decode = on_bad, on_failure, decode
        self.routed, self.spawn, self.raw, self.admit, self.drain = routed, spawn, raw, admit, drain
        self.pass_ident = routed if pass_ident is None else pass_ident
        self.answer_requests = answer_requests
        self._raw = zmq.Socket.shadow(sock.underlying) if drain else None
        self._waiter: asyncio.Future | None = None

    async def serve(self) -> None:
        if self.drain:
            await self._serve_drained()
            return
        sock = self.sock
        while True:
            await self.handle(await sock.recv_multipart())

    async def _serve_drained(self) -> None:
        """Receive without a future per message: wait for the socket's descriptor to be readable (one
        future per wake-up, set by a reader on a duplicate of the descriptor, so pyzmq's own reader on the
        socket is left as it is), then take every queued message with non-blocking receives. libzmq's
        descriptor is edge-triggered: a send on the socket can take the wake-up of a message that arrived
        meanwhile, so every send goes through `post`, which looks for such a message after it."""
        raw = self._raw
        loop = asyncio.get_running_loop()
        fd = os.dup(raw.FD)
        loop.add_reader(fd, self._readable)
        try:
            while True:
                n = 0
                # While libzmq holds a message: a look at the events per message costs less than the Again
                # exception a receive that finds none raises (one per wake-up, about as many as messages).
                while raw.get(EVENTS) & POLLIN:
                    try:
                        frames = _received(raw)
                    except zmq.Again:
                        break
                    await self.handle(frames)
                    n += 1
                    if n == DRAIN_FRAMES:  # a long burst: let the other tasks (the dispatcher) run between
                        n = 0
                        await asyncio.sleep(0)
                self._waiter = waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    self._waiter = None
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    def _readable(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def post(self, ident: bytes | None, frame) -> None:
        """Send one answer now, without a future (for a `drain` loop's socket, whose sends never wait: a
        ROUTER, or a socket with no send high-water mark); a message that came in meanwhile wakes the loop."""
        raw = self._raw
        try:
            if ident is None:
                raw.send(frame, NOBLOCK, copy=False)
            else:
                raw.send_multipart([ident, frame], NOBLOCK, copy=False)
        except zmq.Again:  # no room after all: the asyncio send queues it
            asyncio.ensure_future(self.send_async(ident, frame))
        except zmq.ZMQError:  # EHOSTUNREACH: the asker is gone
            pass
        w = self._waiter
        if w is not None and not w.done() and raw.get(EVENTS) & POLLIN:
            w.set_result(None)

    async def handle(self, frames: list) -> None:
        ident = frames[0] if self.routed else None
        try:
            if self.routed and len(frames) != 2:
                raise ProtocolError("bad_envelope", f"{len(frames) - 1} payload frames")
            frame = frames[-1]
            mtype, body = self.decode(frame)
            handler = self.handlers.get(mtype)
            if handler is None:
                raise ProtocolError("unexpected_type", f"{mtype} is not served on {self.where}")
        except ProtocolError as e:
            self.on_bad(e)
            if self.answer_requests and e.req is not None:
                await self.send(ident, protocol.reply_error(e.req, f"bad message: {e}"[:500]))
            else:
                await self.send(ident, protocol.error(e.reason, e.detail))
            return
        try:
            if self.admit is not None:
                self.admit(ident, mtype, body, frame)
            args = (ident, body) if self.pass_ident else (body,)
            answer = handler(*args, frame) if mtype in self.raw else handler(*args)
            if answer is not None and type(answer) is not bytes and asyncio.iscoroutine(answer):
                if self.spawn is not None:
                    self.spawn(ident, mtype, body, answer)
                    return
                answer = await answer
        except Exception as e:  # a failing handler answers its request; it never stops the loop
            answer = self.on_failure(ident, mtype, body, e)
        if answer is not None:
            await self.send(ident, answer)

    async def send(self, ident: bytes | None, frame: bytes) -> None:
        if self.drain:
            self.post(ident, frame)
            return
        await self.send_async(ident, frame)

    async def send_async(self, ident: bytes | None, frame: bytes) -> None:
        try:
            if ident is None:
                await self.sock.send(frame)
            else:
                await self.sock.send_multipart([ident, frame], copy=False)
        except zmq.ZMQError:  # EHOSTUNREACH: the asker is gone
            pass


def request_id(body) -> int:
    """The request id of a decoded message (a typed one or a dict), 0 when it has none."""
    if isinstance(body, dict):
        return body.get("req", 0)
    return getattr(body, "req", 0)


class Pending:
    """The requests a process sent and awaits, matched with their replies by request id: `open` a request
    (its id and the future its reply resolves, with what it was about), `resolve` one with its reply, or
    `fail` those that match a predicate."""

    def __init__(self):
        self._ids = itertools.count(1)
        self.futures: dict[int, asyncio.Future] = {}
        self.about: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self.futures)

    def open(self, about: tuple = ()) -> tuple[int, asyncio.Future]:
        req = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self.futures[req] = fut
        self.about[req] = about
        return req, fut

    def close(self, req: int) -> None:
        self.futures.pop(req, None)
        self.about.pop(req, None)

    def resolve(self, req: int, reply) -> None:
        fut = self.futures.pop(req, None)
        self.about.pop(req, None)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    def fail(self, which: Callable[[tuple], bool], error: Callable[[tuple], Exception]) -> None:
        for req, about in list(self.about.items()):
            fut = self.futures.get(req)
            if fut is not None and not fut.done() and which(about):
                fut.set_exception(error(about))

    async def wait(self, req: int, fut: asyncio.Future, timeout: float):
        """The reply to `req` (TimeoutError after `timeout` s); the request is closed either way."""
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.close(req)
