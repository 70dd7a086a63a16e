"""Advertisement Analytics (AA): deserialize → filter → projection → campaign join★ → window aggregate★.

The Yahoo streaming benchmark: JSON ad events, keep the views, project to (ad, time), map each ad to its
campaign, count views per campaign per 10-second event-time window.
"""

from __future__ import annotations

import json
import random

import numpy as np

import clasp

NAME = "aa"
WINDOW_MS = 10_000
N_CAMPAIGNS = 100
ADS_PER_CAMPAIGN = 10
EVENT_TYPES = ["view", "click", "purchase"]
AD_TYPES = ["banner", "modal", "sponsored-search", "mail", "mobile"]


def _campaign_table() -> dict[str, str]:
    # The campaign table ships with the app (the benchmark keeps it in Redis); fixed seed, never changes.
    rng = random.Random("aa-campaigns")
    table = {}
    for _ in range(N_CAMPAIGNS):
        campaign = f"{rng.getrandbits(64):016x}"
        for _ in range(ADS_PER_CAMPAIGN):
            table[f"{rng.getrandbits(64):016x}"] = campaign
    return table


CAMPAIGNS = _campaign_table()
_ADS = sorted(CAMPAIGNS)


def deserialize(text: str) -> dict:
    return json.loads(text)


def keep_views(event: dict) -> dict | None:
    return event if event["event_type"] == "view" else None


def projection(event: dict) -> dict:
    return {"ad_id": event["ad_id"], "event_time": event["event_time"]}


def campaign_join(state: list | None, ev: dict) -> tuple[list, dict | None]:
    # The ad's campaign is looked up once and cached in the ad's state with a view count; "" = unknown ad.
    campaign, views = state if state else (CAMPAIGNS.get(ev["ad_id"], ""), 0)
    out = {"campaign": campaign, "event_time": ev["event_time"]} if campaign else None
    return [campaign, views + 1], out


def window_start(event_time: int) -> str:
    return str(event_time - event_time % WINDOW_MS)


def window_aggregate(state: dict | None, ev: dict) -> tuple[dict, None]:
    state = state or {}
    w = window_start(ev["event_time"])
    state[w] = state.get(w, 0) + 1
    return state, None


def ad_key(ev: dict) -> str:
    return ev["ad_id"]


def campaign_key(ev: dict) -> str:
    return ev["campaign"]


def build_dag() -> clasp.Dag:
    dag = clasp.Dag(NAME)
    (dag.operator("deserialize", deserialize)
     >> dag.operator("filter", keep_views)
     >> dag.operator("projection", projection)
     >> dag.operator("campaign_join", campaign_join, stateful=True, key=ad_key)
     >> dag.operator("window_aggregate", window_aggregate, stateful=True, key=campaign_key))
    return dag


def generate(n: int, seed: int) -> list[str]:
    """`n` JSON ad events, ~1 ms apart in event time with jitter; ~3% name an ad outside the table."""
    rng = np.random.default_rng(seed)
    ads = rng.integers(0, len(_ADS), size=n).tolist()
    unknown = (rng.random(n) < 0.03).tolist()
    etype = rng.integers(0, len(EVENT_TYPES), size=n).tolist()
    atype = rng.integers(0, len(AD_TYPES), size=n).tolist()
    times = (1_700_000_000_000 + np.arange(n) + rng.integers(-50, 50, size=n)).tolist()
    users = rng.integers(0, 1 << 48, size=n).tolist()
    pages = rng.integers(0, 1 << 48, size=n).tolist()
    out = []
    for i in range(n):
        ad = f"{users[i] ^ pages[i]:016x}" if unknown[i] else _ADS[ads[i]]
        out.append(json.dumps({"user_id": f"{users[i]:012x}", "page_id": f"{pages[i]:012x}", "ad_id": ad,
                               "ad_type": AD_TYPES[atype[i]], "event_type": EVENT_TYPES[etype[i]],
                               "event_time": times[i], "ip_address": f"10.{i % 250}.{users[i] % 250}.1"}))
    return out


def expected(records: list[str]) -> dict:
    """Views per campaign per window, and views per ad with its campaign, by a plain loop."""
    windows: dict[str, dict[str, int]] = {}
    ads: dict[str, list] = {}
    for text in records:
        ev = json.loads(text)
        if ev["event_type"] != "view":
            continue
        campaign = CAMPAIGNS.get(ev["ad_id"], "")
        ads.setdefault(ev["ad_id"], [campaign, 0])[1] += 1
        if campaign:
            w = window_start(ev["event_time"])
            per = windows.setdefault(campaign, {})
            per[w] = per.get(w, 0) + 1
    return {"windows": windows, "ads": ads}


def result(job) -> dict:
    return {"windows": dict(job.state("window_aggregate")),
            "ads": {k: list(v) for k, v in job.state("campaign_join").items()}}
