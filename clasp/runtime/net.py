"""Small socket helpers shared by the planner, the workers and the client."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

import zmq


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


def run(main_coro_factory, on_term=None) -> int:
    """Run an async main under uvloop, stopping it cleanly on SIGINT/SIGTERM (`on_term`: called on SIGTERM
    instead, e.g. a worker's graceful drain). The main's return value is the exit code."""
    import uvloop

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
