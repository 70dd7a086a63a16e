"""Page Load (PL): parse → url filter → filter → join → aggregate★ → sink.

Average page-load time per page category from a stream of access-log lines: parse the line, drop static
assets, drop failed or implausible loads, join the page's site section with the category table, keep a
per-category count / total / maximum, and format the category's running report.
"""

from __future__ import annotations

import numpy as np

import clasp

NAME = "pl"
MAX_LOAD_MS = 60_000
# Site section -> page category: the table the join looks pages up in.
CATEGORIES = {
    "news": "media", "video": "media", "podcasts": "media", "blog": "media",
    "shop": "commerce", "cart": "commerce", "checkout": "commerce", "deals": "commerce",
    "account": "account", "login": "account", "settings": "account",
    "search": "search", "help": "support", "contact": "support", "docs": "support",
    "sports": "sports", "scores": "sports", "weather": "local", "maps": "local", "events": "local",
}
_SECTIONS = sorted(CATEGORIES) + ["legacy", "beta"]  # the last two are in no category: dropped by the join
_ASSETS = (".css", ".js", ".png", ".jpg", ".gif", ".ico", ".svg", ".woff2")
_AGENTS = ["Mozilla/5.0", "Chrome/120.0", "Safari/17.1", "Firefox/121.0", "Googlebot/2.1", "curl/8.4"]
_BOTS = ("Googlebot", "curl")
_STATUSES = [200] * 17 + [304, 404, 500]


def parse(line: str) -> dict | None:
    """`ts ip method url status load_ms agent` → dict; None for a line that is not that."""
    parts = line.split(" ", 6)
    if len(parts) != 7 or not parts[4].isdigit():
        return None
    ts, ip, method, url, status, ms, agent = parts
    try:
        return {"ts": int(ts), "ip": ip, "method": method, "url": url, "status": int(status),
                "load_ms": int(ms), "agent": agent}
    except ValueError:
        return None


def url_filter(r: dict) -> dict | None:
    path = r["url"].split("?", 1)[0]
    if path.endswith(_ASSETS) or r["method"] != "GET":
        return None
    r["path"] = path
    return r


def load_filter(r: dict) -> dict | None:
    ok = r["status"] == 200 and 0 < r["load_ms"] <= MAX_LOAD_MS and not r["agent"].startswith(_BOTS)
    return r if ok else None


def section_of(path: str) -> str:
    return path.split("/", 2)[1] if path.count("/") >= 1 else ""


def join_category(r: dict) -> dict | None:
    category = CATEGORIES.get(section_of(r["path"]))
    return {"category": category, "load_ms": r["load_ms"]} if category else None


def aggregate(state: list | None, r: dict) -> tuple[list, list]:
    # Integers only, so the totals do not depend on the order the loads arrive in.
    count, total, peak = state if state else (0, 0, 0)
    count, total, peak = count + 1, total + r["load_ms"], max(peak, r["load_ms"])
    return [count, total, peak], [[r["category"], count, total, peak]]


def report(row: list) -> str:
    category, count, total, peak = row
    return f"{category}: {count} loads, mean {total / count:.1f} ms, max {peak} ms"


def category_key(r: dict) -> str:
    return r["category"]


def build_dag() -> clasp.Dag:
    dag = clasp.Dag(NAME)
    (dag.operator("parse", parse)
     >> dag.operator("url_filter", url_filter)
     >> dag.operator("filter", load_filter)
     >> dag.operator("join", join_category)
     >> dag.operator("aggregate", aggregate, stateful=True, key=category_key)
     >> dag.operator("sink", report))
    return dag


def generate(n: int, seed: int) -> list[str]:
    """`n` access-log lines: ~25% static assets, some errors, bots, slow outliers and uncategorized pages."""
    rng = np.random.default_rng(seed)
    sec = rng.integers(0, len(_SECTIONS), size=n).tolist()
    page = rng.integers(0, 500, size=n).tolist()
    asset = (rng.random(n) < 0.25).tolist()
    ext = rng.integers(0, len(_ASSETS), size=n).tolist()
    status = rng.integers(0, len(_STATUSES), size=n).tolist()
    agent = rng.integers(0, len(_AGENTS), size=n).tolist()
    # Log-normal load times around ~800 ms; a few beyond MAX_LOAD_MS (timeouts) get filtered.
    ms = np.clip(rng.lognormal(6.7, 0.8, size=n), 1, 120_000).astype(np.int64).tolist()
    post = (rng.random(n) < 0.05).tolist()
    query = (rng.random(n) < 0.3).tolist()
    out = []
    t0 = 1_700_000_000
    for i in range(n):
        url = f"/{_SECTIONS[sec[i]]}/page{page[i]}"
        if asset[i]:
            url = f"/{_SECTIONS[sec[i]]}/static/a{page[i]}{_ASSETS[ext[i]]}"
        if query[i]:
            url += f"?ref={page[i] % 7}"
        out.append(f"{t0 + i // 10} 192.0.2.{i % 254 + 1} {'POST' if post[i] else 'GET'} {url} "
                   f"{_STATUSES[status[i]]} {ms[i]} {_AGENTS[agent[i]]}")
    return out


def expected(records: list[str]) -> dict[str, list[int]]:
    """[count, total ms, max ms] per category, by a plain loop."""
    agg: dict[str, list[int]] = {}
    for line in records:
        ts, ip, method, url, status, ms, agent = line.split(" ", 6)
        path = url.split("?", 1)[0]
        load = int(ms)
        if method != "GET" or path.endswith(_ASSETS) or status != "200" or not 0 < load <= MAX_LOAD_MS:
            continue
        if agent.startswith(_BOTS) or section_of(path) not in CATEGORIES:
            continue
        a = agg.setdefault(CATEGORIES[section_of(path)], [0, 0, 0])
        a[0] += 1
        a[1] += load
        a[2] = max(a[2], load)
    return agg


def result(job) -> dict[str, list[int]]:
    return {k: list(v) for k, v in job.state("aggregate").items()}
