"""The Nexmark queries as plain Python over a list of events, in event time: the exact answers every other
implementation (the windowed state machines of `queries.py`, the Bytewax dataflows of clasp/bench/peers/) must give.

Each `qN(events)` returns the query's whole answer in a canonical form (sorted where the query has no order):

| query | answer |
| --- | --- |
| Q0 pass-through | every bid `[auction, bidder, price, dateTime, extra]`, in input order |
| Q1 currency conversion | the same with the price in euros (`euros`) |
| Q2 selection | `[auction, price]` of the bids on every 123rd auction id, in input order |
| Q3 local item suggestion | `[name, city, state, auction id]` of category-10 auctions by sellers in OR, ID or CA |
| Q4 average price per category | `[category, closed auctions, sum of their prices, average]` over closed auctions |
| Q5 hot items | `[start, end, auction, bids]`: per 10 s window sliding by 2 s, the auctions with the most bids |
| Q7 highest bid | `[start, end, auction, price, bidder, dateTime]`: per 10 s tumbling window, its highest bids |
| Q8 new users | `[person id, name, window start]`: people who joined and opened an auction in the same 10 s window |

Q4 uses the closed-auction definition (the Beam suite's `WinningBids`): an auction closes when event time passes its
`expires`; its price is its highest bid with `dateTime` in `[auction dateTime, expires]` and a price at least its
reserve; an auction with no such bid has no price and does not count. At the end of the input every auction has
closed. Windows are `[start, end)` in ms, aligned to the epoch; Q7 takes the bids of the window with its maximum
price (the SQL version's `BETWEEN end - 10 s AND end` would also take a bid at exactly `end`, of the next window).
"""

from __future__ import annotations

from collections import Counter, defaultdict

WINDOW_MS = 10_000
Q5_SLIDE_MS = 2_000
Q2_MODULUS = 123
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10
EUROS_PER_DOLLAR = 0.908


def euros(price: int) -> float:
    return EUROS_PER_DOLLAR * price


def _bids(events):
    return (e for e in events if e["kind"] == "bid")


def q0(events: list[dict]) -> list[list]:
    return [[b["auction"], b["bidder"], b["price"], b["dateTime"], b["extra"]] for b in _bids(events)]


def q1(events: list[dict]) -> list[list]:
    return [[b["auction"], b["bidder"], euros(b["price"]), b["dateTime"], b["extra"]] for b in _bids(events)]


def q2(events: list[dict]) -> list[list]:
    return [[b["auction"], b["price"]] for b in _bids(events) if b["auction"] % Q2_MODULUS == 0]


def q3(events: list[dict]) -> list[list]:
    people = {e["id"]: e for e in events if e["kind"] == "person" and e["state"] in Q3_STATES}
    return sorted([people[a["seller"]]["name"], people[a["seller"]]["city"], people[a["seller"]]["state"], a["id"]]
                  for a in events if a["kind"] == "auction" and a["category"] == Q3_CATEGORY
                  and a["seller"] in people)


def closed_auction_prices(events: list[dict]) -> dict[int, tuple[int, int]]:
    """auction id → (category, price) of every auction with a winning bid."""
    auctions = {e["id"]: e for e in events if e["kind"] == "auction"}
    best: dict[int, int] = {}
    for b in _bids(events):
        a = auctions.get(b["auction"])
        if a and a["dateTime"] <= b["dateTime"] <= a["expires"] and b["price"] >= a["reserve"]:
            best[a["id"]] = max(best.get(a["id"], 0), b["price"])
    return {i: (auctions[i]["category"], p) for i, p in best.items()}


def q4(events: list[dict]) -> list[list]:
    per: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for category, price in closed_auction_prices(events).values():
        per[category][0] += 1
        per[category][1] += price
    return sorted([c, n, s, s / n] for c, (n, s) in per.items())


def sliding_starts(ts: int, size: int = WINDOW_MS, slide: int = Q5_SLIDE_MS) -> list[int]:
    last = ts - ts % slide
    return [s for s in range(last, ts - size, -slide)]


def q5(events: list[dict]) -> list[list]:
    counts: dict[int, Counter] = defaultdict(Counter)
    for b in _bids(events):
        for start in sliding_starts(b["dateTime"]):
            counts[start][b["auction"]] += 1
    out = []
    for start, c in counts.items():
        top = max(c.values())
        out += [[start, start + WINDOW_MS, auction, n] for auction, n in c.items() if n == top]
    return sorted(out)


def q7(events: list[dict]) -> list[list]:
    windows: dict[int, list[dict]] = defaultdict(list)
    for b in _bids(events):
        windows[b["dateTime"] - b["dateTime"] % WINDOW_MS].append(b)
    out = []
    for start, bids in windows.items():
        top = max(b["price"] for b in bids)
        out += [[start, start + WINDOW_MS, b["auction"], b["price"], b["bidder"], b["dateTime"]]
                for b in bids if b["price"] == top]
    return sorted(out)


def q8(events: list[dict]) -> list[list]:
    def start(e):
        return e["dateTime"] - e["dateTime"] % WINDOW_MS

    sellers = {(a["seller"], start(a)) for a in events if a["kind"] == "auction"}
    return sorted([p["id"], p["name"], start(p)] for p in events
                  if p["kind"] == "person" and (p["id"], start(p)) in sellers)


QUERIES = {"q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q7": q7, "q8": q8}
