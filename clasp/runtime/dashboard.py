"""The web dashboard: static files and a read-only JSON API on the planner's metrics HTTP server.

The HTTP server runs in its own thread (prometheus-client's WSGI server); the planner's state belongs
to its event loop. A request for a view finds it in a cache of at most one second; when it is older,
the view is built *on the event loop* (`loop.call_soon_threadsafe`: the planner's dicts are never read
from another thread while it changes them), serialized there once, and the bytes shared by every
request and stream in the next second. Concurrent requests for a stale view wait on one build. With no
page open the planner does nothing for the dashboard at all.

Routes (GET only): `/` the page, `/static/NAME` its files, `/api/cluster`, `/api/jobs`, `/api/jobs/ID`,
`/api/stream?job=ID` (server-sent events, one `update` a second: `{"cluster", "jobs", "job"}`), and
`/metrics` (Prometheus, unchanged).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import threading
import time
from collections.abc import Callable
from importlib import resources
from urllib.parse import parse_qs

from clasp.core import dashboard as views

STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8"}
MAX_STREAMS = 16  # server-sent event streams at once (a thread each); beyond that the page polls
STREAM_PERIOD = 1.0
BUILD_TIMEOUT = 5.0
_HEADERS = [("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
            ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'")]


def _clean(x):
    """A copy of `x` with non-finite floats as null (JSON has no NaN or Infinity)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [_clean(v) for v in x]
    return x


def dumps(obj) -> bytes:
    try:
        return json.dumps(obj, allow_nan=False, separators=(",", ":"), default=str).encode()
    except ValueError:  # a NaN or an infinity somewhere: rare, so the cleaning pass only then
        return json.dumps(_clean(obj), separators=(",", ":"), default=str).encode()


def planner_view(planner, key: str):
    """The JSON-ready view `key` ("cluster", "jobs", "job/ID") of a `Planner`, or None (no such job)."""
    if key == "cluster":
        info = {"id": planner.id, "endpoint": getattr(planner, "endpoint", None),
                "uptime_s": round(time.monotonic() - planner.started, 1), **planner.last_rates,
                "queue": sum(j.queued for j in planner.jobs.values()), "rescales": planner.migrations.rescales,
                "records_lost": planner.migrations.records_lost, "policy": planner.policy,
                "curve": planner.security.enabled}
        return views.cluster_view(planner.workers, planner.jobs, time.monotonic(), info)
    if key == "jobs":
        return views.jobs_view(planner.jobs)
    job = planner.jobs.get(int(key.split("/", 1)[1]))
    if job is None:
        return None
    return views.job_view(job, planner.workers, planner.job_stats(job))


class Dashboard:
    """The WSGI app in front of the metrics app; `build(key)` runs on `loop` and returns a view or None."""

    def __init__(self, loop, build: Callable[[str], object], ttl: float = 1.0):
        self.loop, self.build, self.ttl = loop, build, ttl
        self.cache: dict[str, tuple[float, bytes | None]] = {}
        self.pending: dict[str, concurrent.futures.Future] = {}
        self.lock = threading.Lock()
        self.streams = 0
        self.builds = 0  # views built (a test and the benchmark read it)

    # ----------------------------------------------------------------- views
    def _build_on_loop(self, key: str, fut: concurrent.futures.Future) -> None:
        try:
            view = self.build(key)
            fut.set_result(None if view is None else dumps(view))
        except Exception as e:  # answered as a 500; the planner goes on
            fut.set_exception(e)

    def view(self, key: str) -> bytes | None:
        """The view's JSON, at most `ttl` s old; None: no such job."""
        now = time.monotonic()
        with self.lock:
            hit = self.cache.get(key)
            if hit is not None and now - hit[0] < self.ttl:
                return hit[1]
            fut = self.pending.get(key)
            if fut is None:
                fut = self.pending[key] = concurrent.futures.Future()
                self.loop.call_soon_threadsafe(self._build_on_loop, key, fut)
        try:
            data = fut.result(BUILD_TIMEOUT)
        finally:
            with self.lock:
                if self.pending.get(key) is fut:
                    del self.pending[key]
                    if fut.done() and fut.exception() is None:
                        self.cache[key] = (time.monotonic(), fut.result())
                        self.builds += 1
                        if len(self.cache) > 64:  # views of jobs nobody looks at any more
                            for k in [k for k, (t, _) in self.cache.items() if now - t > 10 * self.ttl]:
                                del self.cache[k]
        return data

    def update(self, job: str | None) -> bytes:
        """One stream event's body: the cluster, the job list and (if asked for and known) one job."""
        j = self.view(f"job/{int(job)}") if job else None
        return b'{"cluster":' + self.view("cluster") + b',"jobs":' + self.view("jobs") + b',"job":' + (
            j if j is not None else b"null") + b"}"

    # ----------------------------------------------------------------- WSGI
    def app(self, metrics_app):
        def dashboard_app(environ, start_response):
            path = environ.get("PATH_INFO", "/")
            if path == "/metrics" or path.startswith("/metrics/"):
                return metrics_app(environ, start_response)
            if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
                return _send(start_response, "405 Method Not Allowed", b"the dashboard is read-only\n",
                             "text/plain", [("Allow", "GET, HEAD")])
            try:
                return self._route(path, environ, start_response)
            except (TimeoutError, concurrent.futures.TimeoutError):
                return _send(start_response, "503 Service Unavailable", b'{"error":"the planner is busy"}')
            except Exception as e:
                return _send(start_response, "500 Internal Server Error", dumps({"error": repr(e)[:300]}))
        return dashboard_app

    def _route(self, path: str, environ, start_response):
        if path in ("/", "/index.html"):
            return _send(start_response, "200 OK", _static("index.html"), STATIC["index.html"])
        if path.startswith("/static/") and path[8:] in STATIC:
            return _send(start_response, "200 OK", _static(path[8:]), STATIC[path[8:]])
        if path in ("/api/cluster", "/api/jobs"):
            return _send(start_response, "200 OK", self.view(path[5:]))
        if path.startswith("/api/jobs/"):
            ident = path[10:]
            data = self.view(f"job/{int(ident)}") if ident.isdigit() else None
            if data is None:
                return _send(start_response, "404 Not Found", dumps({"error": f"no job {ident}"}))
            return _send(start_response, "200 OK", data)
        if path == "/api/stream":
            job = (parse_qs(environ.get("QUERY_STRING", "")).get("job") or [None])[0]
            if job is not None and not job.isdigit():
                job = None
            with self.lock:
                if self.streams >= MAX_STREAMS:
                    return _send(start_response, "503 Service Unavailable", b'{"error":"too many streams; poll"}')
                self.streams += 1
            start_response("200 OK", [("Content-Type", "text/event-stream"), ("Cache-Control", "no-store"),
                                      *_HEADERS])
            return self._stream(job)
        return _send(start_response, "404 Not Found", dumps({"error": f"nothing at {path}"}))

    def _stream(self, job: str | None):
        try:
            yield b"retry: 2000\n\n"
            while True:
                yield b"event: update\ndata: " + self.update(job) + b"\n\n"
                time.sleep(STREAM_PERIOD)
        finally:
            with self.lock:
                self.streams -= 1


def _static(name: str) -> bytes:
    return resources.files("clasp.runtime").joinpath("static", name).read_bytes()


def _send(start_response, status: str, body: bytes, ctype: str = "application/json", extra=()) -> list[bytes]:
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store"), *_HEADERS, *extra])
    return [body]
