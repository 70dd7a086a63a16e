"""CURVE keys and the one security object every clasp process hands its sockets to.

A key directory (`clasp keys init DIR`):

    DIR/public/server.key          the cluster's public key (planner and workers share one key pair)
    DIR/public/client.key          a client's public key; every *.key file here is allowed to connect
    DIR/public/NAME.key            ... one per `clasp keys add-client DIR NAME`; delete it to revoke NAME
    DIR/private/server.key_secret  the cluster's secret key (planner and workers only)
    DIR/private/client.key_secret  the default client's secret key
    DIR/clients/NAME/              what to give client NAME: public/server.key + private/client.key_secret

The files are ZeroMQ certificates (`zmq.auth.load_certificate` reads them), written 0600 in 0700
directories; a secret key file that its group or others can read, or an allow-list that they can write,
is refused (KeysError).

`Security(keys)` is made once per process (planner, worker, client) from `Keys` or None (plaintext,
`--insecure`). Its hooks, called where the sockets are made:

- `server(sock, name)` before `bind`: CURVE server with the cluster key, ZAP domain `name`, a monitor
  that counts failed handshakes in `clasp_auth_failures_total{socket=name}`;
- `peer(sock)` before `connect` from a planner or worker (it authenticates with the cluster key);
- `client(sock)` before `connect` from a user's client (its own key);
- `start_zap(ctx)` once, before the first `server()`: the ZAP handler that allows only the public keys
  in DIR/public (read again when that directory changes, so a removed key is refused at once);
- `run()`: the coroutine serving ZAP and the monitors; `collector()`: the Prometheus view.

Every socket also gets `zmq.MAXMSGSIZE` (`clasp.core.limits`), with or without keys.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import socket as _socket
import stat
import struct
from collections import Counter, deque
from pathlib import Path

import zmq
from zmq.utils import z85

from clasp.core.limits import LIMITS, Limits

log = logging.getLogger("clasp.security")

ENV = "CLASP_KEYS"
SERVER = "server"
CLIENT = "client"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"

_FAILED = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake", zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
           zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused"}
_EVENTS = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
MAKE_KEYS = "make keys with `clasp keys init DIR` and pass `--keys DIR` (or set CLASP_KEYS=DIR)"


class KeysError(ValueError):
    """A key directory or key file that is missing, malformed or not private enough."""


# ----------------------------------------------------------------------------- key files
def _cert(public: bytes, secret: bytes | None) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    kind = "Secret" if secret else "Public"
    lines = [f"#   ****  Generated on {now} by clasp  ****", f"#   ZeroMQ CURVE {kind} Certificate",
             "#   Exchange securely, or use a secure mechanism to verify the contents", "#   of this file after "
             "exchange. Store public certificates in your home", "#   directory, in the .curve subdirectory.",
             "", "metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str, force: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise KeysError(f"{path} exists; not overwriting a key") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_keypair(directory: str | os.PathLike, name: str, public_dir: str | os.PathLike | None = None,
                  secret_name: str | None = None) -> bytes:
    """A new key pair: DIR/public/NAME.key and DIR/private/NAME.key_secret; returns the public key."""
    d = Path(directory)
    public, secret = zmq.curve_keypair()
    pub_dir = _private_dir(Path(public_dir) if public_dir else d / "public")
    _write_private(pub_dir / f"{name}.key", _cert(public, None))
    _write_private(_private_dir(d / "private") / f"{secret_name or name}.key_secret", _cert(public, secret))
    return public


def init_keys(directory: str | os.PathLike) -> Path:
    """`clasp keys init DIR`: the cluster's key pair and one client's."""
    d = _private_dir(Path(directory))
    if (d / "public" / f"{SERVER}.key").exists():
        raise KeysError(f"{d} already holds keys (public/{SERVER}.key); remove it or choose another directory")
    write_keypair(d, SERVER)
    write_keypair(d, CLIENT)
    return d


def add_client(directory: str | os.PathLike, name: str) -> Path:
    """`clasp keys add-client DIR NAME`: allow a new client; returns the directory to give it, which holds
    the cluster's public key and the client's secret key (a keys directory a client can use as it is)."""
    d = Path(directory)
    Keys(d)  # refuses a directory that is not a cluster's
    if not name or "/" in name or name.startswith(".") or name in (SERVER, CLIENT):
        raise KeysError(f"bad client name {name!r}")
    if (d / "public" / f"{name}.key").exists():
        raise KeysError(f"a client {name!r} exists already (public/{name}.key)")
    bundle = _private_dir(d / "clients" / name)
    _private_dir(bundle / "public")
    _write_private(bundle / "public" / f"{SERVER}.key", (d / "public" / f"{SERVER}.key").read_text())
    # The secret goes into the client's bundle only; the cluster keeps the public key, its allow-list entry.
    write_keypair(bundle, name, public_dir=d / "public", secret_name=CLIENT)
    (bundle / "public" / f"{name}.key").unlink(missing_ok=True)
    return bundle


def _read_key(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise KeysError(f"no key file {path}: {MAKE_KEYS}") from None
    if secret and st.st_mode & 0o077:
        raise KeysError(f"{path} can be read by its group or others (mode {stat.filemode(st.st_mode)}): "
                        f"refusing to use it; `chmod 600 {path}`")
    if not secret and st.st_mode & 0o022:
        raise KeysError(f"{path} can be written by its group or others (mode {stat.filemode(st.st_mode)}): "
                        f"refusing to trust it; `chmod 600 {path}`")
    public = secret_key = None
    for line in path.read_text().splitlines():
        key, _, value = line.strip().partition("=")
        value = value.strip().strip('"')
        if key.strip() == "public-key":
            public = value.encode()
        elif key.strip() == "secret-key":
            secret_key = value.encode()
    if public is None or len(public) != 40 or (secret and (secret_key is None or len(secret_key) != 40)):
        raise KeysError(f"{path} is not a CURVE {'secret' if secret else 'public'} key file")
    return public, secret_key


class Keys:
    """A key directory, loaded and checked. `client` names the client key pair to use when connecting."""

    def __init__(self, directory: str | os.PathLike, client: str = CLIENT):
        self.dir = Path(directory).expanduser().resolve()
        if not self.dir.is_dir():
            raise KeysError(f"no key directory {self.dir}: {MAKE_KEYS}")
        self.client_name = client
        self.server_public = _read_key(self.dir / "public" / f"{SERVER}.key", secret=False)[0]
        self._server: tuple[bytes, bytes] | None = None
        self._client: tuple[bytes, bytes] | None = None
        self._allowed: tuple[tuple, frozenset] | None = None

    def __repr__(self) -> str:
        return f"Keys({str(self.dir)!r})"

    @property
    def server_pair(self) -> tuple[bytes, bytes]:
        if self._server is None:
            self._server = _read_key(self.dir / "private" / f"{SERVER}.key_secret", secret=True)
        return self._server

    @property
    def client_pair(self) -> tuple[bytes, bytes]:
        if self._client is None:
            self._client = _read_key(self.dir / "private" / f"{self.client_name}.key_secret", secret=True)
        return self._client

    def allowed(self) -> frozenset[bytes]:
        """The public keys (z85) in DIR/public, read again whenever the directory or a file in it changes."""
        pub = self.dir / "public"
        files = sorted(pub.glob("*.key"))
        stamp = (pub.stat().st_mtime_ns, tuple((f.name, f.stat().st_mtime_ns) for f in files))
        if self._allowed is None or self._allowed[0] != stamp:
            keys = set()
            for f in files:
                try:
                    keys.add(_read_key(f, secret=False)[0])
                except KeysError as e:
                    log.error("ignoring a public key: %s", e)
            self._allowed = (stamp, frozenset(keys))
        return self._allowed[1]


def as_keys(keys: Keys | str | os.PathLike | None) -> Keys | None:
    if keys is None or isinstance(keys, Keys):
        return keys
    return Keys(keys)


# Key directories of the clusters this process started (LocalCluster), by planner endpoint: so that
# `clasp.connect(cluster.planner)` in the same process is authenticated with no extra step.
_LOCAL: dict[str, Path] = {}


def remember(endpoint: str, directory: str | os.PathLike) -> None:
    _LOCAL[endpoint] = Path(directory)


def forget(endpoint: str) -> None:
    _LOCAL.pop(endpoint, None)


def resolve(keys: Keys | str | os.PathLike | None, address: str | None = None) -> Keys | None:
    """The keys to use: `keys` if given, else those of a cluster this process started at `address`, else
    the CLASP_KEYS environment variable, else None (plaintext)."""
    if keys is not None:
        return as_keys(keys)
    if address in _LOCAL:
        return Keys(_LOCAL[address])
    env = os.environ.get(ENV)
    return Keys(env) if env else None


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        return all(ipaddress.ip_address(a[4][0]).is_loopback for a in _socket.getaddrinfo(host, None))
    except OSError:
        return False


def check_exposure(host: str, keys: Keys | None, insecure: bool, what: str) -> str | None:
    """Why a process must not start: it would bind `host`, reachable from other hosts, without keys."""
    if keys is not None or insecure or is_loopback(host):
        return None
    return (f"clasp {what}: refusing to bind {host} without keys: anyone who can reach it could run code as this "
            f"user. {MAKE_KEYS}, or pass --insecure on a network you trust")


# ----------------------------------------------------------------------------- the security object
class Security:
    """What one process needs to secure its sockets: keys (None: plaintext), limits, and the counters."""

    def __init__(self, keys: Keys | str | os.PathLike | None = None, limits: Limits = LIMITS):
        self.keys = as_keys(keys)
        self.limits = limits
        self.failures: Counter = Counter()  # socket name -> failed handshakes
        self.rejections: Counter = Counter()  # limit -> messages refused
        self._zap: zmq.Socket | None = None
        self._monitors: list[tuple[zmq.Socket, str, bool]] = []
        self._tasks: list[asyncio.Task] = []
        self._running = False

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    def harden(self, sock: zmq.Socket) -> zmq.Socket:
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message)
        return sock

    def server(self, sock: zmq.Socket, name: str) -> zmq.Socket:
        """A socket that binds: CURVE server (ZAP domain `name`) and a monitor counting failed handshakes."""
        self.harden(sock)
        if self.keys is None:
            return sock
        if self._zap is None:
            raise RuntimeError("start_zap(ctx) must come before the first server socket")
        public, secret = self.keys.server_pair
        sock.curve_server = True
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.zap_domain = name.encode()
        self._watch(sock, name, server=True)
        return sock

    def peer(self, sock: zmq.Socket, name: str | None = None) -> zmq.Socket:
        """A planner's or worker's connecting socket: it authenticates with the cluster key. `name`: watch
        its handshakes too (counted and logged: a worker whose key the planner refuses says so)."""
        self.harden(sock)
        if self.keys is not None:
            public, secret = self.keys.server_pair
            self._curve_client(sock, public, secret)
            if name:
                self._watch(sock, name, server=False)
        return sock

    def client(self, sock: zmq.Socket) -> zmq.Socket:
        """A user's client socket (synchronous): its own key pair."""
        self.harden(sock)
        if self.keys is not None:
            public, secret = self.keys.client_pair
            self._curve_client(sock, public, secret)
        return sock

    def _curve_client(self, sock, public: bytes, secret: bytes) -> None:
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.curve_serverkey = self.keys.server_public

    def rejected(self, limit: str) -> None:
        self.rejections[limit] += 1

    # ------------------------------------------------------------------------- ZAP and monitors
    def start_zap(self, ctx: zmq.Context) -> None:
        """Bind this context's ZAP handler (no-op without keys). Requests queue until run() serves them."""
        if self.keys is None or self._zap is not None:
            return
        self.keys.server_pair  # noqa: B018 - refuse a bad secret key before anything binds
        self.keys.allowed()
        self._zap = ctx.socket(zmq.REP)
        self._zap.linger = 0
        self._zap.bind(ZAP_ENDPOINT)

    def _watch(self, sock, name: str, server: bool) -> None:
        mon = sock.get_monitor_socket(_EVENTS if server else _EVENTS & ~zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED)
        self._monitors.append((mon, name, server))
        if self._running:
            self._tasks.append(asyncio.ensure_future(self._monitor_loop(mon, name, server)))

    async def run(self) -> None:
        """Serve ZAP requests and watch the monitors until cancelled."""
        self._running = True
        if self._zap is not None:
            self._tasks.append(asyncio.ensure_future(self._zap_loop()))
        self._tasks += [asyncio.ensure_future(self._monitor_loop(m, n, s)) for m, n, s in self._monitors]
        try:
            await asyncio.Event().wait()
        finally:
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for m, _, _ in self._monitors:
                m.close(0)
            if self._zap is not None:
                self._zap.close(0)

    def zap_reply(self, frames: list[bytes]) -> list[bytes]:
        """The answer to one ZAP request (RFC 27): 200 for a CURVE key in DIR/public, else 400."""
        if len(frames) < 6:
            return [b"1.0", frames[1] if len(frames) > 1 else b"", b"500", b"bad ZAP request", b"", b""]
        version, request_id, domain, address, _identity, mechanism = frames[:6]
        creds = frames[6:]
        if mechanism == b"CURVE" and len(creds) == 1 and len(creds[0]) == 32:
            key = z85.encode(creds[0])
            if key in self.keys.allowed():
                return [version, request_id, b"200", b"OK", key, b""]
            why = f"key {key.decode()} is not in {self.keys.dir / 'public'}"
        else:
            why = f"mechanism {mechanism.decode(errors='replace')} is not CURVE"
        log.warning("refused a connection from %s to %s: %s", address.decode(errors="replace"),
                    domain.decode(errors="replace"), why)
        return [version, request_id, b"400", b"key not allowed", b"", b""]

    async def _zap_loop(self) -> None:
        while True:
            frames = await self._zap.recv_multipart()
            try:
                reply = self.zap_reply(frames)
            except Exception as e:  # a ZAP handler that fails must answer, or the handshake hangs
                log.exception("ZAP request failed")
                reply = [b"1.0", frames[1] if len(frames) > 1 else b"", b"500", str(e).encode()[:100], b"", b""]
            await self._zap.send_multipart(reply)

    async def _monitor_loop(self, mon, name: str, server: bool) -> None:
        """Count failed handshakes. libzmq reports most with an event; a peer that sends bytes that are not
        ZMTP and hangs up shows only as a connection accepted and closed without a handshake, which the
        per-connection bookkeeping below (handshakes are matched to connections in accept order) counts too."""
        pending: deque[int] = deque()  # accepted connections (fds) without a handshake outcome yet
        logged = 0
        while True:
            frames = await mon.recv_multipart()
            event, value = struct.unpack("=hi", frames[0][:6])
            if event == zmq.EVENT_ACCEPTED:
                pending.append(value)
                continue
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if pending:
                    pending.popleft()
                continue
            if event == zmq.EVENT_DISCONNECTED:
                if value in pending:
                    pending.remove(value)
                    reason = "not a ZMTP peer (closed before any handshake)"
                else:
                    continue
            elif event in _FAILED:
                if pending:
                    pending.popleft()
                reason = f"{_FAILED[event]} ({_describe(event, value)})"
            else:
                continue
            self.failures[name] += 1
            logged += 1
            if logged <= 5 or logged % 100 == 0:
                if server:
                    log.warning("%s: a connection failed its CURVE handshake: %s (%d so far)", name, reason,
                                self.failures[name])
                else:
                    log.error("%s: the CURVE handshake with the server failed: %s: is %s the cluster's key "
                              "directory?", name, reason, self.keys.dir)

    def collector(self):
        return _Collector(self)


def _describe(event: int, value: int) -> str:
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"ZAP status {value}: the peer's key is not allowed"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return "the peer does not use CURVE (plaintext)"
        if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            return "cryptographic error: the peer uses another server key"
        return f"ZMTP protocol error {value:#x}"
    return "connection closed or timed out during the handshake"


class _Collector:
    def __init__(self, security: Security):
        self.s = security

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        f = CounterMetricFamily("clasp_auth_failures", "Connections that failed the CURVE handshake (refused key, "
                                "plaintext, garbage), per socket", labels=["socket"])
        for name, n in sorted(self.s.failures.items()):
            f.add_metric([name], n)
        yield f
        r = CounterMetricFamily("clasp_limit_rejections", "Messages refused for a size or queue limit",
                                labels=["limit"])
        for name, n in sorted(self.s.rejections.items()):
            r.add_metric([name], n)
        yield r
