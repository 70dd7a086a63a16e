"""The user's handle on a cluster: `clasp.connect(addr)` → Client → `submit(dag)` → Job.

Synchronous on purpose (scripts, notebooks, tests): one DEALER socket to the planner, requests tagged
with ids, pushes pipelined with a bounded window of unacknowledged chunks. A ZeroMQ socket belongs to one
thread, so a client shared by threads gives each its own socket (`Client`).

A planner that has gone away fails every call within seconds, not after its timeout: a socket monitor
sees the connection close (the planner process exited) or ZeroMQ heartbeats time it out (the planner's
host or network went silent); the calls waiting on it raise `PlannerUnavailable` at once, and a call
made while no connection has been up for `liveness` seconds (or none ever came up) raises it too.
Heartbeats are answered by libzmq's I/O thread, so a planner that is busy, but alive, never trips them.

Keys (`docs/SECURITY.md`): `connect(addr, keys=DIR)`, else the keys of a cluster this process started at
`addr` (`LocalCluster`), else `CLASP_KEYS`, else plaintext. A failed CURVE handshake (this client's key
refused, plaintext against a CURVE planner or the reverse, another cluster's server key) raises
`AuthError` instead of waiting for an answer that cannot come.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable
from typing import Any

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from clasp.core import limits, protocol
from clasp.core.credit import CHUNK_RECORDS, PushCredit, charge
from clasp.core.dag import Dag, DagError
from clasp.core.protocol import ProtocolError
from clasp.runtime.security import Keys, Security, resolve


class ClaspError(RuntimeError):
    """A request the cluster refused or could not answer."""


class ClaspTimeout(ClaspError, TimeoutError):
    """The cluster did not answer, or did not finish, in time."""


class PlannerUnavailable(ClaspError, ConnectionError):
    """No planner answers at the address: nothing accepts connections there, or the connection to it
    closed (the planner exited) or went silent, so no answer can come. `why` is the reason alone."""

    def __init__(self, message: str, why: str = ""):
        super().__init__(message)
        self.why = why or message


class AuthError(ClaspError, ConnectionError):
    """The planner and this client could not authenticate each other (CURVE): no answer can come."""


LIVENESS = 2.0  # seconds without a connection to the planner before a call fails
HEARTBEAT_IVL = 1.0  # ZeroMQ heartbeats on the client's socket: a ping every second,
HEARTBEAT_TIMEOUT = 3.0  # and a connection that answers nothing for 3 s is closed (a silent host)
_POLL_SLICE = 0.5


class _Connection:
    """One thread's DEALER socket to the planner: its connection events and the replies that came on it.
    A ZeroMQ socket belongs to one thread, so a client keeps one of these per thread that calls it."""

    def __init__(self, client: Client):
        self.client = client
        self.thread = threading.current_thread()
        self.sock = client.security.client(client._ctx.socket(zmq.DEALER))
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, int(HEARTBEAT_IVL * 1000))
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(HEARTBEAT_TIMEOUT * 1000))
        # Before connect(), so the first handshake is seen.
        self.monitor = self.sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        self.handshake_failed: str | None = None  # why the last handshake failed, while none ever succeeded
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.up = False  # a connection to the planner is up (ZMTP handshake done)
        self.ever_up = False
        self.down_since = time.monotonic()
        self.pending: set[int] = set()  # sent, not answered
        self.lost: set[int] = set()  # sent, and the connection closed before the answer came
        self.replies: dict[int, dict] = {}
        self.sock.connect(client.address)

    def send_frame(self, req: int, frame: bytes, mtype: str) -> int:
        try:
            limits.check_message(len(frame), mtype)
        except limits.LimitError as e:
            raise ClaspError(str(e)) from None
        self.sock.send(frame, copy=len(frame) < 65536)
        self.pending.add(req)
        return req

    def wait(self, req: int, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        liveness = self.client.liveness
        while req not in self.replies:
            self.watch()
            if req in self.replies:
                break
            if req in self.lost:
                self.lost.discard(req)
                raise self.gone(what, "the connection to it closed before it answered")
            now = time.monotonic()
            if not self.up and now - self.down_since >= liveness:
                self.pending.discard(req)
                if self.handshake_failed and not self.ever_up:
                    raise self.auth_error(what)
                if self.ever_up:
                    raise self.gone(what, f"no connection to it for {now - self.down_since:.1f} s")
                raise self.gone(what, f"nothing accepted a connection there within {liveness:g} s")
            left = deadline - now
            if left <= 0:
                self.pending.discard(req)
                raise ClaspTimeout(f"{what}: no answer from {self.client.address} within {timeout} s")
            self.poller.poll(int(min(left, _POLL_SLICE) * 1000) + 1)
        reply = self.replies.pop(req)
        if not reply["ok"]:
            err = reply.get("error") or "unknown error"
            if err.startswith("timeout"):
                raise ClaspTimeout(err)
            raise ClaspError(err)
        return reply.get("result")

    def why_refused(self, event: int, value: int) -> str:
        keys = self.client.keys
        where = f"keys {keys.dir}" if keys else "no keys"
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return f"the planner refused this client's key ({where}): it is not among the planner's allowed keys"
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            if keys is None:
                return ("the planner requires CURVE keys and this client speaks plaintext: pass keys=DIR, set "
                        "CLASP_KEYS=DIR, or use the \"keys\" of the cluster's --info file")
            return f"the planner does not use CURVE (it runs --insecure) and this client has {where}"
        return f"the CURVE handshake failed ({where}): ZMTP error {value:#x}"

    def auth_error(self, what: str) -> AuthError:
        return AuthError(f"{what}: cannot authenticate with the clasp planner at {self.client.address}: "
                         f"{self.handshake_failed}")

    def gone(self, what: str, why: str) -> PlannerUnavailable:
        address = self.client.address
        if self.ever_up:
            return PlannerUnavailable(f"{what}: the clasp planner at {address} has gone away: {why}", why)
        return PlannerUnavailable(f"{what}: no clasp planner at {address}: {why}", why)

    def watch(self) -> None:
        """Take the connection's events, then the replies that have come."""
        while self.monitor.get(zmq.EVENTS) & zmq.POLLIN:
            msg = recv_monitor_message(self.monitor)
            event, value = msg["event"], msg["value"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.up = self.ever_up = True
                self.handshake_failed = None
            elif event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                self.handshake_failed = self.why_refused(event, value)
                self.pending.clear()
                raise self.auth_error("connect")
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                # Also a dropped connection; an auth problem once it keeps happening with no handshake done.
                self.handshake_failed = ("every connection closed during the CURVE handshake: the planner may use "
                                         "another cluster's keys" if self.client.keys else
                                         "every connection closed during the handshake")
            elif event == zmq.EVENT_DISCONNECTED and self.up:
                self.up = False
                self.down_since = time.monotonic()
                # The planner routes a reply to the connection the request came on: once that is closed,
                # nothing still outstanding can be answered (a new connection is a new peer to it).
                self.take()
                self.lost |= self.pending
                self.pending.clear()
        self.take()

    def take(self) -> None:
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                mtype, body = protocol.decode(frame)
            except ProtocolError as e:
                raise ClaspError(f"the planner sent a bad message: {e}") from None
            if mtype == "reply":
                self.replies[body["req"]] = body
                self.pending.discard(body["req"])
            elif mtype == "error":
                raise ClaspError(f"the planner rejected a message: {body['reason']}: {body['detail']}")

    def close(self) -> None:
        if self.sock.closed:
            return
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)


class Client:
    """A connection to a planner. Use as a context manager, or call close().

    `timeout`: how long a call waits for its answer (longer calls have their own, larger, timeouts);
    `liveness`: how long a call waits while no connection to the planner is up (never connected, or
    closed and not back) before it raises PlannerUnavailable.

    Threads may share a client: each thread that calls it gets its own connection to the planner (a
    ZeroMQ socket belongs to one thread), made at its first call and closed with the client, or by a
    later call once its thread has ended. Replies to a thread's requests come on its own connection."""

    def __init__(self, address: str, timeout: float = 10.0, liveness: float = LIVENESS,
                 keys: Keys | str | None = None, insecure: bool = False):
        self.address = address
        self.timeout = timeout
        self.liveness = liveness
        self.keys = None if insecure else resolve(keys, address)
        self.security = Security(self.keys)
        self._ctx = zmq.Context()
        self._local = threading.local()
        self._conns: list[_Connection] = []
        self._conns_lock = threading.Lock()
        self._closed = False
        self._ids = itertools.count(1)  # next() on a count is atomic: request ids stay unique across threads
        self.last_job: Job | None = None
        try:
            self._call("jobs", {}, timeout)
        except AuthError:
            self.close()
            raise
        except PlannerUnavailable as e:
            self.close()
            raise PlannerUnavailable(f"no clasp planner answers at {address}: {e.why}", e.why) from None
        except ClaspTimeout:
            self.close()
            hint = "" if self.keys else " (if it requires keys: pass keys=DIR or set CLASP_KEYS)"
            raise ClaspTimeout(f"no clasp planner answers at {address} within {timeout} s{hint}") from None

    # ----------------------------------------------------------------- plumbing
    def _conn(self) -> _Connection:
        """The calling thread's connection, made at its first call; the connections of threads that have
        ended are closed then, so a client used from many short-lived threads holds no more sockets than
        it has live callers."""
        conn = getattr(self._local, "conn", None)
        if conn is None or self._closed:
            with self._conns_lock:
                if self._closed:
                    raise ClaspError("the client is closed")
                for old in [c for c in self._conns if not c.thread.is_alive()]:
                    old.close()
                    self._conns.remove(old)
                conn = self._local.conn = _Connection(self)
                self._conns.append(conn)
        return conn

    def _send(self, mtype: str, body: dict) -> int:
        return self._send_frame(*self._frame(mtype, body))

    def _frame(self, mtype: str, body: dict) -> tuple[int, bytes]:
        req = next(self._ids)
        return req, protocol.encode(mtype, {**body, "req": req})

    def _send_frame(self, req: int, frame: bytes, mtype: str = "a request") -> int:
        return self._conn().send_frame(req, frame, mtype)

    def _wait(self, req: int, timeout: float, what: str) -> Any:
        return self._conn().wait(req, timeout, what)

    def _call(self, mtype: str, body: dict, timeout: float | None = None) -> Any:
        return self._wait(self._send(mtype, body), timeout or self.timeout, mtype)

    # ----------------------------------------------------------------- API
    def submit(self, dag: Dag, placement: dict[str, dict[int, float]] | None = None, *,
               autoscale: bool | None = None, policy: str | None = None, state: str | None = None,
               key_weights: dict[str, list[float]] | None = None) -> Job:
        """Deploy `dag` on the cluster.

        `placement` (operator -> {worker index -> share}) fixes the placement; worker indices count the
        live workers in registration order. `autoscale` (default: the planner's setting, off with an
        explicit placement) lets the control loop re-place the job as its load changes; `policy` picks
        the scaling policy (default: the planner's, `clasp`); `state` is where stateful operators keep
        their state: "local" (on the worker owning the key, the default) or "remote" (the planner's state
        server, one round trip per micro-batch: the paper's Fig. 4 baseline). `key_weights` (stateful
        operator -> 128 numbers, the share of its requests in each key group) lets an explicit placement
        give each owner its share of the requests rather than of the groups, before the planner has
        measured them itself."""
        options = {"autoscale": autoscale, "policy": policy, "state": state}
        if not isinstance(dag, Dag):
            raise DagError(f"submit expects a clasp.Dag, not {type(dag).__name__}")
        spec = dag.to_spec()
        body: dict = {"dag": spec.pack(), "options": {k: v for k, v in options.items() if v is not None}}
        try:
            limits.check_dag(len(protocol.encode("submit", body)), body["dag"]["functions"])
        except limits.LimitError as e:
            raise ClaspError(str(e)) from None
        if placement is not None:
            body["placement"] = {name: {int(i): float(s) for i, s in shares.items()}
                                 for name, shares in placement.items()}
        if key_weights:
            body["key_weights"] = {op: [float(v) for v in row] for op, row in key_weights.items()}
        result = self._call("submit", body, max(self.timeout, 30.0))
        self.last_job = Job(self, result["job"], dag.name, result)
        return self.last_job

    def job(self, job_id: int) -> Job:
        """A handle on a job submitted by any client (e.g. to scale it while another client pushes)."""
        for j in self.jobs():
            if j["job"] == job_id:
                return Job(self, job_id, j["name"], j)
        raise ClaspError(f"no job {job_id}")

    def scale(self, workers: int, job: Job | None = None) -> dict:
        """Re-place the running job (default: the last submitted) with the policy's placement for `workers`
        workers and migrate; returns when the migration is done. A call while one runs waits its turn."""
        return (job or self._last()).scale(workers)

    def autoscale(self, enabled: bool, job: Job | None = None) -> bool:
        """Turn the control loop on or off for the job (default: the last submitted)."""
        return (job or self._last()).autoscale(enabled)

    def _last(self) -> Job:
        if self.last_job is None:
            raise ClaspError("no job submitted from this client")
        return self.last_job

    def workers(self) -> list[dict]:
        return self._call("workers", {})

    def jobs(self) -> list[dict]:
        return self._call("jobs", {})

    def drain(self, worker: str, timeout: float = 300.0) -> dict:
        """Live-migrate every share and key group of `worker` to the others, then let it exit (code 0);
        returns when it is done (what `clasp drain WORKER` and SIGTERM to the worker do)."""
        return self._call("drain", {"worker": str(worker)}, max(self.timeout, timeout))

    def pool(self) -> dict:
        """The elastic pool: the provider, what the planner wishes for (workers, release), who is leaving."""
        return self._call("pool", {})

    def close(self) -> None:
        """Close every thread's connection; call it once the other threads are done with the client."""
        with self._conns_lock:
            if self._closed:
                return
            self._closed = True
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Job:
    """A running job: push records, wait for it to go idle, read its state and statistics."""

    def __init__(self, client: Client, job_id: int, name: str, info: dict):
        self.client = client
        self.id = job_id
        self.name = name
        self.info = info
        self._credits = threading.local()  # a thread's pushes wait for their acks on its own connection

    def push(self, records: Iterable, chunk: int = CHUNK_RECORDS, window: int = 8) -> int:
        """Send records to the planner's incoming queue; returns when all are accepted.

        Blocks while the job's queue at the planner is at its bound (records, bytes:
        `--max-queued-bytes`, or what the job drains in `--max-queue-delay` seconds) and goes on as it
        drains: pushes of at most `chunk` records and about two megabytes packed (an eighth of the bound, if
        smaller; sent lz4-compressed where that pays, `protocol.pack_segments`) go while they fit the credit
        of the planner's last acknowledgement, at most `window` at a time (`clasp.core.credit`). Any
        iterable, an endless generator too: it is read one chunk ahead of what the planner accepted."""
        credit = getattr(self._credits, "credit", None)  # the thread's last call's credit and record size carry over
        if credit is None:
            credit = self._credits.credit = PushCredit()
        credit.window = window
        n = 0
        batch: list = []
        limit = credit.next_records(chunk)
        try:
            for r in records:
                batch.append(r)
                if len(batch) >= limit:
                    n += self._push_chunk(credit, batch)
                    batch = []
                    limit = credit.next_records(chunk)
            if batch:
                n += self._push_chunk(credit, batch)
            while credit.inflight:
                self._take_ack(credit)
        except BaseException:
            credit.forget()  # what was in flight is the failed call's: the next call starts with nothing
            raise
        return n

    def _push_chunk(self, credit: PushCredit, batch: list) -> int:
        req, frame, packed = self._chunk_frame(batch)
        nbytes = charge(packed, len(batch))  # as the planner charges it
        while True:  # the target can shrink with an ack (the planner's bound), so it is checked after each
            if nbytes > 2 * credit.target and len(batch) > 1:  # larger records than the last chunk's: halve it
                half = len(batch) // 2
                return self._push_chunk(credit, batch[:half]) + self._push_chunk(credit, batch[half:])
            if credit.may_send(nbytes):
                break
            self._take_ack(credit)
        credit.sent(self.client._send_frame(req, frame, "push"), nbytes, len(batch))
        return len(batch)

    def _take_ack(self, credit: PushCredit) -> None:
        c = self.client
        req = credit.oldest()
        result = c._wait(req, max(c.timeout, 60.0), "push") or {}
        credit.acked(req, result.get("credit"), result.get("bound"))

    def _chunk_frame(self, batch: list) -> tuple[int, bytes, int]:
        """(request id, frame, its bytes with compressed segments at their packed size: `protocol.packed_size`)."""
        try:
            # in segments, which the planner passes on to the workers as they are (`protocol.pack_segments`)
            segments = protocol.pack_segments(batch)
            req, frame = self.client._frame("push", {"job": self.id, "segments": segments})
            return req, frame, protocol.packed_size(len(frame), segments)
        except (TypeError, ValueError, OverflowError) as e:
            bad = next((r for r in batch if not _packable(r)), None)
            raise ClaspError(f"record {bad!r:.100} of type {type(bad).__name__} is not msgpack-serializable: "
                             f"{e}") from None

    def wait_idle(self, timeout: float = 60.0) -> dict:
        """Block until every pushed record and all its chained requests are done, every partition of the
        job's declared sources is read to its end (a stream's never is: see `stop`) with everything derived
        from it, every processing-time timer (`timers.at_processing`) due at or before the moment of the call
        has fired with what its callback emitted (timers due later do not hold it: docs/TIME.md), and no
        recovery from a worker's death, rollback, restarted worker's rejoin or migration of the job is under
        way. Returns {pushed, completed, lost}, and `read` for a job with declared sources."""
        c = self.client
        return c._wait(c._send("wait_idle", {"job": self.id, "timeout": float(timeout)}), timeout + 10.0,
                       "wait_idle")

    def stop(self, timeout: float = 60.0) -> dict:
        """End a job on unbounded sources: every reader stops where it is, everything read completes, and
        (with checkpoints) a last checkpoint is taken, whose positions a later run could resume from. The
        job's state and collected outputs stay readable. Returns `wait_idle`'s summary plus `checkpoint`
        (its id, or None) and `positions` ([[source, partition, position]]). A worker that dies meanwhile
        makes it fail: the job rolls back and reads again; call it again."""
        c = self.client
        return c._wait(c._send("stop", {"job": self.id, "timeout": float(timeout)}), timeout + 10.0, "stop")

    def end_input(self) -> None:
        """The last push: the planner refuses later ones, and the watermark of the DAG's push source
        (`Dag.push_source`) reaches the end once every pushed record is complete, so every window and
        event-time timer downstream fires (`wait_idle` then returns after them)."""
        self.client._call("end_input", {"job": self.id})

    def state(self, operator: str, timeout: float = 60.0) -> dict:
        """The keyed state of a stateful operator, gathered from every worker. While the job recovers from a
        worker's death (or one may have died unnoticed), it waits up to `timeout` s for the job to serve
        again: recovered, and its replay caught up with what was complete before (docs/RECOVERY.md)."""
        return self._serving_call("state", operator, timeout)

    def collected(self, operator: str, timeout: float = 60.0) -> list:
        """The outputs of an operator declared with collect=True, from every worker (order unspecified);
        waits for a recovering job like `state`."""
        return self._serving_call("collected", operator, timeout)

    def _serving_call(self, mtype: str, operator: str, timeout: float) -> Any:
        c = self.client
        return c._wait(c._send(mtype, {"job": self.id, "op": operator, "timeout": float(timeout)}),
                       max(c.timeout, timeout + 10.0), mtype)

    def stats(self, fresh: bool = False) -> dict:
        """Throughput, input rate, latency p50/p95/p99, errors, and per-worker metrics.

        `fresh=True` asks every worker for its exact counters now, instead of the last heartbeat's."""
        return self.client._call("stats", {"job": self.id, "fresh": bool(fresh)})

    def scale(self, workers: int) -> dict:
        """Re-place with the policy's placement for `workers` workers and migrate; returns the migration record."""
        return self.client._call("scale", {"job": self.id, "workers": int(workers)}, max(self.client.timeout, 120.0))

    def place(self, placement: dict[str, dict[int, float]]) -> dict:
        """Migrate to an explicit placement, operator -> {worker index -> share}; worker indices count the
        job's live workers, those active now first. Returns the migration's record."""
        body = {name: {int(i): float(s) for i, s in shares.items()} for name, shares in placement.items()}
        return self.client._call("place", {"job": self.id, "placement": body}, max(self.client.timeout, 120.0))

    def autoscale(self, enabled: bool) -> bool:
        return self.client._call("autoscale", {"job": self.id, "enabled": bool(enabled)})

    def cancel(self) -> None:
        self.client._call("cancel", {"job": self.id})


def _packable(obj) -> bool:
    try:
        msgpack.packb(obj, use_bin_type=True)
        return True
    except (TypeError, ValueError, OverflowError):
        return False


def connect(address: str, timeout: float = 10.0, liveness: float = LIVENESS, keys: Keys | str | None = None,
            insecure: bool = False) -> Client:
    """Connect to the planner at `address` (tcp://HOST:PORT); fails within `timeout` if none answers, and
    with PlannerUnavailable within `liveness` seconds if nothing accepts a connection there.

    `keys`: a key directory (`clasp keys init`; a client's own from `clasp keys add-client`) or Keys; by
    default those of a cluster this process started at `address`, else CLASP_KEYS. `insecure=True`:
    plaintext. A key the planner refuses, or plaintext against a CURVE planner, raises AuthError."""
    return Client(address, timeout, liveness, keys=keys, insecure=insecure)
