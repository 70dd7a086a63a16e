"""Network Monitor (NWM): successful logins preceded by several failed attempts from the same host.

split → success filter → success parse ─┐
      → fail filter    → fail parse    ─┴→ join★ → aggregate★ → filter → functor → sink

`split` cuts a chunk of an sshd log into lines; each path keeps its kind of line and parses it. The join
(keyed by host and 2-minute window) pairs every success with every earlier failure of that host in the
window; the aggregation counts a success's pairs; the filter passes a success the moment its count
reaches THRESHOLD; the functor formats the alert. Pairing is a symmetric hash join: whichever side
arrives second emits the pair, so the answer does not depend on how the two paths interleave.
"""

from __future__ import annotations

import re

import numpy as np

import clasp

NAME = "nwm"
WINDOW_S = 120
THRESHOLD = 3
N_HOSTS = 60
_USERS = ["root", "admin", "alice", "bob", "carol", "dave", "deploy", "git", "oracle", "test"]
_LINE = re.compile(r"^(\d+) (\S+) sshd\[\d+\]: (Accepted|Failed) password for (?:invalid user )?(\S+) "
                   r"from (\S+) port \d+")
_NOISE = ["pam_unix(sshd:session): session opened for user {u}", "Connection closed by {h} port {p}",
          "Received disconnect from {h} port {p}:11: disconnected by user"]


def split(chunk: str) -> list[str]:
    return [line for line in chunk.split("\n") if line]


def success_filter(line: str) -> str | None:
    return line if "Accepted password" in line else None


def fail_filter(line: str) -> str | None:
    return line if "Failed password" in line else None


def parse_login(line: str) -> dict | None:
    m = _LINE.match(line)
    if m is None:
        return None
    return {"ts": int(m[1]), "server": m[2], "ok": m[3] == "Accepted", "user": m[4], "host": m[5]}


def window_key(ev: dict) -> str:
    return f"{ev['host']}|{ev['ts'] // WINDOW_S}"


def join(state: dict | None, ev: dict) -> tuple[dict, list]:
    # State per host-window: failure times "f" and successes "s" ([ts, user]) seen so far.
    state = state or {"f": [], "s": []}
    if ev["ok"]:
        out = [{"ts": ev["ts"], "host": ev["host"], "user": ev["user"]} for f in state["f"] if f < ev["ts"]]
        state["s"].append([ev["ts"], ev["user"]])
    else:
        out = [{"ts": ts, "host": ev["host"], "user": user} for ts, user in state["s"] if ev["ts"] < ts]
        state["f"].append(ev["ts"])
    return state, out


def aggregate(state: int | None, pair: dict) -> tuple[int, dict]:
    n = (state or 0) + 1
    return n, {**pair, "n": n}


def threshold_filter(ev: dict) -> dict | None:
    return ev if ev["n"] == THRESHOLD else None


def alert(host: str, user: str, ts: int) -> str:
    return f"ALERT host={host} user={user} ts={ts}: login after >= {THRESHOLD} failed attempts"


def functor(ev: dict) -> str:
    return alert(ev["host"], ev["user"], ev["ts"])


def sink(text: str) -> str:
    return text


def success_key(pair: dict) -> int:
    return pair["ts"]


def build_dag() -> clasp.Dag:
    dag = clasp.Dag(NAME)
    sp = dag.operator("split", split)
    j = dag.operator("join", join, stateful=True, key=window_key)
    sp >> dag.operator("success_filter", success_filter) >> dag.operator("success_parse", parse_login) >> j
    sp >> dag.operator("fail_filter", fail_filter) >> dag.operator("fail_parse", parse_login) >> j
    (j >> dag.operator("aggregate", aggregate, stateful=True, key=success_key)
     >> dag.operator("filter", threshold_filter)
     >> dag.operator("functor", functor)
     >> dag.operator("sink", sink, collect=True))
    return dag


def generate(n: int, seed: int) -> list[str]:
    """`n` chunks of 1-4 sshd log lines, one second apart: logins, typos, noise and failure bursts.

    A burst is 2-8 failures from one host, followed (70%) by that host's success: bursts of 3+ before a
    success in the same window are what the app must report.
    """
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 5, size=n)
    cuts = [0] + np.cumsum(sizes).tolist()
    lines: list[str] = []
    ts = 1_700_000_000
    want = cuts[-1]
    pending: list[tuple[str, str, bool]] = []  # the current burst's remaining (host, user, ok) events
    while len(lines) < want:
        ts += 1
        pid = int(rng.integers(1000, 60000))
        if pending:
            host, user, ok = pending.pop(0)
        else:
            roll = rng.random()
            host = f"10.0.{int(rng.integers(0, 4))}.{int(rng.integers(1, N_HOSTS // 4 + 1))}"
            user = _USERS[int(rng.integers(0, len(_USERS)))]
            if roll < 0.1:
                k = int(rng.integers(2, 9))
                pending = [(host, user, False)] * (k - 1)
                if rng.random() < 0.7:
                    pending.append((host, user, True))
                ok = False
            elif roll < 0.3:
                lines.append(f"{ts} srv{pid % 3} sshd[{pid}]: "
                             + _NOISE[int(rng.integers(0, 3))].format(u=user, h=host, p=pid))
                continue
            else:
                ok = rng.random() < 0.8
        who = user if ok or rng.random() < 0.5 else f"invalid user {user}"
        lines.append(f"{ts} srv{pid % 3} sshd[{pid}]: {'Accepted' if ok else 'Failed'} password for {who} "
                     f"from {host} port {pid} ssh2")
    return ["\n".join(lines[cuts[i]:cuts[i + 1]]) for i in range(n)]


def expected(records: list[str]) -> list[str]:
    """The sorted alerts: successes with >= THRESHOLD earlier failures of their host in their window."""
    fails: dict[tuple[str, int], list[int]] = {}
    successes = []
    for chunk in records:
        for line in chunk.split("\n"):
            ev = parse_login(line)
            if ev is None:
                continue
            if ev["ok"]:
                successes.append(ev)
            else:
                fails.setdefault((ev["host"], ev["ts"] // WINDOW_S), []).append(ev["ts"])
    out = []
    for ev in successes:
        before = [f for f in fails.get((ev["host"], ev["ts"] // WINDOW_S), []) if f < ev["ts"]]
        if len(before) >= THRESHOLD:
            out.append(alert(ev["host"], ev["user"], ev["ts"]))
    return sorted(out)


def result(job) -> list[str]:
    return sorted(job.collected("sink"))
