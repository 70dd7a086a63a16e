"""One network namespace per local process, on its own address, so a local cluster talks like separate hosts.

Over loopback a remote chained request skips most of the network stack. With `Hosts`, the planner and
every worker run in their own namespace (`clasp-<owner pid>-<seq>-<name>`) with one end of a veth pair
(`eth0`, its own address in a private /24 of 10.213.0.0/16); the other end is a port of a bridge
(`clbr<owner pid>-<k>`), which also has the subnet's .1, so the owning process (the client that drives
the job) reaches every process. Processes enter a namespace with `nsenter --net=...`, which execs the
command in place: the PID that `Popen` returns is the Python process, so cgroup CPU limits still apply
to it. Needs root and iproute2; `NetnsError` says why rather than running without namespaces.

Leftovers of an owner that died without `release()` (SIGKILL, a crash) are removed by `sweep()`, which
every `Hosts()` runs first: processes still in the namespaces are killed, namespaces, veths and
bridges deleted.
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

NS_PREFIX = "clasp-"
SPACE = ipaddress.ip_network("10.213.0.0/16")
_NS = re.compile(rf"^{NS_PREFIX}(\d+)-\d+-")
# Interface names are at most 15 characters, too short for a namespace's name: links carry the owner pid
# and a counter that is unique within the owner.
_LINK = re.compile(r"^cl(?:br|v)(\d+)-\d+$")
_LOCK = Path("/run/clasp-netns.lock")
_seq = itertools.count()
_links = itertools.count()


class NetnsError(RuntimeError):
    """Namespaces were asked for but cannot be set up here."""


def available() -> str | None:
    """None when namespaces can be set up here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "per-process network namespaces need root; run as root or drop --hosts"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"--hosts needs `{tool}` ({package}), which is not installed"
    return None


def _ip(*args: str, check: bool = True) -> str:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {r.stderr.strip() or f'exit code {r.returncode}'}")
    return r.stdout


def _json(*args: str) -> list[dict]:
    text = _ip("-j", *args).strip()
    return json.loads(text) if text else []


def _alive(pid: int) -> bool:
    """Running, not a zombie: an orphan's zombie waits for a reaper that may never come, but it holds nothing."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _kill_in(ns: str, timeout: float = 2.0) -> None:
    """Kill every process still in namespace `ns`, and wait until they are gone (so their cgroups empty)."""
    pids = [int(p) for p in _ip("netns", "pids", ns, check=False).split() if p.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _delete(namespaces: list[str], links: list[str]) -> None:
    for ns in namespaces:
        _kill_in(ns)
    # A veth pair dies with either end, and a namespace's end with the namespace; so the bridge-side ends
    # first, then the namespaces, then the bridges. Errors are things already gone.
    for link in links:
        _ip("link", "delete", link, check=False)
    for ns in namespaces:
        _ip("netns", "delete", ns, check=False)


def _owner_gone(pid: str) -> bool:
    return not Path(f"/proc/{pid}").exists()


def sweep() -> list[str]:
    """Remove the namespaces, veths and bridges of owners that no longer exist; returns what was removed."""
    why = available()
    if why is not None:
        raise NetnsError(why)
    with _locked():
        namespaces = [n["name"] for n in _json("netns", "list")
                      if (m := _NS.match(n["name"])) and _owner_gone(m.group(1))]
        links = [link["ifname"] for link in _json("link", "show")
                 if (m := _LINK.match(link["ifname"])) and _owner_gone(m.group(1))]
        # Ports before bridges, as `_delete` expects.
        links.sort(key=lambda name: name.startswith("clbr"))
        _delete(namespaces, links)
    return namespaces + links


class _locked:
    """An exclusive lock across processes: two owners starting at once must not pick the same subnet."""

    def __enter__(self):
        self.f = open(_LOCK, "a")  # noqa: SIM115 - closed in __exit__
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        self.f.close()


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = []
    for r in _json("-4", "route", "show", "table", "all"):
        if r.get("dst") not in (None, "default"):
            try:
                out.append(ipaddress.ip_network(r["dst"], strict=False))
            except ValueError:
                pass
    return out


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of SPACE that no route on this host overlaps, starting from one that depends on our pid."""
    used = _used_networks()
    subnets = list(SPACE.subnets(new_prefix=24))[1:-1]
    start = os.getpid() % len(subnets)
    for net in subnets[start:] + subnets[:start]:
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetnsError(f"every /24 of {SPACE} is already routed here; no subnet left for --hosts")


class Hosts:
    """A bridge and one namespace per `add(name)`; `release()` deletes them all. Sweeps leftovers first."""

    def __init__(self):
        sweep()
        self.owner = f"{os.getpid()}-{next(_seq)}"
        self.namespaces: dict[str, str] = {}  # name -> namespace
        self.addresses: dict[str, str] = {}  # name -> its address
        self.links: list[str] = []  # bridge-side veth ends, then the bridge last
        self.bridge = f"clbr{os.getpid()}-{next(_links)}"
        try:
            with _locked():
                self.subnet = _free_subnet()
                self._hosts = self.subnet.hosts()
                self.links.append(self.bridge)
                _ip("link", "add", self.bridge, "type", "bridge")
                self.address = str(next(self._hosts))
                _ip("addr", "add", f"{self.address}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.release()
            raise

    def add(self, name: str) -> str:
        """A namespace for `name`, joined to the bridge; returns its address."""
        if name in self.namespaces:
            raise ValueError(f"{name!r} already has a namespace")
        address = next(self._hosts, None)
        if address is None:
            raise NetnsError(f"{self.subnet} has no address left for {name!r}")
        ns = self.namespaces[name] = f"{NS_PREFIX}{self.owner}-{name}"
        veth = f"clv{os.getpid()}-{next(_links)}"
        self.links.insert(-1, veth)
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.addresses[name] = str(address)
        return str(address)

    def command(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside `name`'s namespace, as the same process (nsenter execs it)."""
        return ["nsenter", f"--net=/run/netns/{self.namespaces[name]}", "--", *argv]

    def release(self) -> None:
        """Delete every namespace, veth and the bridge; kills any process still inside a namespace."""
        _delete(list(self.namespaces.values()), self.links)
        self.namespaces.clear()
        self.links.clear()
