"""The Nexmark queries as stages of stateless maps and keyed time operators (`clasp.windows`): what the runtime
will run, each stage an operator of the job.

A query is a list of `Stage`s, each reading the events of a kind ("person", "auction", "bid") or an earlier stage's
outputs. A map stage turns one value into a list of values. A keyed stage runs a keyed time operator; its inputs
are `[key, event time, value]` (made by the map before it) and for a join the first input is the left, the second
the right. A stage's outputs reach the later stages before the watermark that released them does, as they would
travel in a batch ahead of it, so a window's result, timed at the window's last instant (`end - 1` ms, as Flink
times window results), is never late for the next window. `answer(query, outputs)` turns the last stage's outputs
into the reference's canonical answer (`reference.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clasp.apps.nexmark.reference import (
    Q2_MODULUS,
    Q3_CATEGORY,
    Q3_STATES,
    Q5_SLIDE_MS,
    WINDOW_MS,
    euros,
)
from clasp.windows import (
    POS_INF,
    IntervalJoin,
    KeyedDriver,
    PartitionClock,
    TimerOperator,
    WindowJoin,
    WindowOperator,
    after,
    sliding,
    tumbling,
)


@dataclass
class Stage:
    name: str
    inputs: list[str]
    map: Callable[[Any], list] | None = None
    op: Any = None


def _bid_row(b: dict) -> list:
    return [b["auction"], b["bidder"], b["price"], b["dateTime"], b["extra"]]


def q0() -> list[Stage]:
    return [Stage("pass", ["bid"], map=lambda b: [_bid_row(b)])]


def q1() -> list[Stage]:
    return [Stage("euros", ["bid"], map=lambda b: [[b["auction"], b["bidder"], euros(b["price"]), b["dateTime"],
                                                    b["extra"]]])]


def q2() -> list[Stage]:
    return [Stage("select", ["bid"],
                  map=lambda b: [[b["auction"], b["price"]]] if b["auction"] % Q2_MODULUS == 0 else [])]


def q3() -> list[Stage]:
    # An unbounded join of two keyed streams: each seller's person with every one of their auctions, whichever
    # comes first; an interval join with infinite bounds.
    return [
        Stage("sellers", ["person"], map=lambda p: [[p["id"], p["dateTime"], [p["name"], p["city"], p["state"]]]]
              if p["state"] in Q3_STATES else []),
        Stage("auctions", ["auction"], map=lambda a: [[a["seller"], a["dateTime"], a["id"]]]
              if a["category"] == Q3_CATEGORY else []),
        Stage("join", ["sellers", "auctions"], op=IntervalJoin(-math.inf, math.inf)),
        Stage("rows", ["join"], map=lambda o: [[*o[1], o[2]]]),
    ]


NO_OUTPUT = ()  # what a call that emits nothing returns: one object, not a new list a record
NO_BIDS = ()  # the early bids of an auction that has none waiting
TERMS, BEST, EARLY, ARMED = range(4)  # an auction's state, a list
# The early bids are kept in chunks of this many: a bid copies the chunk it joins and the list of chunks, not every
# bid before it (a hot auction gets hundreds ahead of it, and their copies and frees were the square of that).
EARLY_CHUNK = 32


def auction_fn(state: list | None, row: list, timers) -> tuple[list | None, tuple]:
    """One auction's bids until it closes, from rows `[auction id, event time, body]` (a bid's body its price, an
    auction's its terms `[dateTime, expires, category, reserve]`). The state, a list (`TERMS`, `BEST`, `EARLY`,
    `ARMED`): the auction's terms once it arrived, the best valid bid, and the `[time, price]` of the bids that
    arrived before it, in chunks of `EARLY_CHUNK` (kept until no auction that could take them can still
    arrive). The early bids share one timer, at the earliest of them, its time kept in the state (`ARMED`):
    setting and cancelling one per bid made a key's early bids cost the square of their number, and looking for
    it among the timers a scan a bid (Nexmark read from many files at once brings about half the bids ahead of
    their auction). A state is never changed in place (a checkpoint may still be packing it): a change is a new
    list."""
    body = row[2]
    if state is not None and type(body) is not list:
        terms = state[TERMS]
        if terms is not None:  # the bid against the auction's terms, `better_bid` inline: most records come here
            if terms[0] <= row[1] <= terms[1] and body >= terms[3]:
                best = state[BEST]
                if best is None or body > best:
                    return [terms, body, NO_BIDS, None], NO_OUTPUT
            return state, NO_OUTPUT
    terms, best, early, armed = state if state is not None else (None, None, NO_BIDS, None)
    if type(body) is list:  # the auction: its early bids are its to judge, the close timer at its expiry
        if early:  # `better_bid` over them, in one comprehension: a hot auction has hundreds
            opened, expires, _, reserve = body
            top = max([p for chunk in early for t, p in chunk if opened <= t <= expires and p >= reserve],
                      default=None)
            if top is not None and (best is None or top > best):
                best = top
        if armed is not None:
            timers.cancel(armed, "early")
        timers.at(after(body[1]), "close")  # every bid up to `expires` included is in
        return [body, best, NO_BIDS, None], NO_OUTPUT
    ts = row[1]
    # An auction that opened before this bid has arrived once the watermark passes it. Bids come mostly in time
    # order: one later than the armed time leaves the timer be, without computing its own.
    if armed is None or ts < armed:
        due = after(ts)
        if due != armed:
            if armed is not None:
                timers.cancel(armed, "early")
            timers.at(due, "early")
            armed = due
    if early and len(early[-1]) < EARLY_CHUNK:
        early = [*early[:-1], [*early[-1], [ts, body]]]
    else:
        early = [*early, [[ts, body]]]
    return [None, None, early, armed], NO_OUTPUT


def better_bid(terms: list, best: int | None, ts: int, price: int) -> int | None:
    """The auction's best price after a bid at `ts`: a bid counts within [opening, expiry] and at the reserve."""
    opened, expires, _, reserve = terms
    if opened <= ts <= expires and price >= reserve and (best is None or price > best):
        return price
    return best


def auction_timer(state: list | None, t: float, payload: str, timers) -> tuple[list | None, list]:
    if state is None:  # an earlier timer due in the same advance already forgot the auction
        return None, []
    terms = state[TERMS]
    if payload == "close":
        return None, ([[terms[2], terms[1], state[BEST]]] if state[BEST] is not None else [])
    if terms is None:
        early = [e for chunk in state[EARLY] for e in chunk if e[0] >= timers.watermark]
        if not early:
            return None, []
        due = after(min(e[0] for e in early))  # the next of them to expire
        timers.at(due, "early")
        return [None, None, [early[i:i + EARLY_CHUNK] for i in range(0, len(early), EARLY_CHUNK)], due], []
    return state, []


def category_fn(state: list | None, row: list, timers) -> tuple[list, list]:
    """A category's closed auctions and the sum of their prices, from rows `[category, expiry, price]`."""
    n, total = state or (0, 0)
    n, total = n + 1, total + row[2]
    return [n, total], [[row[0], n, total, total / n]]


def no_timer(state: Any, t: float, payload: Any, timers) -> tuple[Any, list]:
    return state, []


def q4() -> list[Stage]:
    return [
        # The row is the value: the timer functions read what the cluster's rows give them (`nexmark_cluster`).
        Stage("auctions_and_bids", ["auction", "bid"], map=lambda e: [[r[0], r[1], r] for r in auction_rows(e)]),
        Stage("close", ["auctions_and_bids"], op=TimerOperator(auction_fn, auction_timer)),
        Stage("by_category", ["close"], map=lambda o: [[o[0], o[1], o]]),
        Stage("average", ["by_category"], op=TimerOperator(category_fn, no_timer)),
    ]


def auction_rows(e: dict) -> list | None:
    """An auction's or a bid's row `[auction id, event time, body]` for `auction_fn`, in a list (a map's outputs;
    None for a person)."""
    kind = e["kind"]
    if kind == "bid":
        return [[e["auction"], e["dateTime"], e["price"]]]
    if kind == "auction":
        return [[e["id"], e["dateTime"], [e["dateTime"], e["expires"], e["category"], e["reserve"]]]]
    return None


def max_bids(acc: list, bid: list) -> list:
    """[price, bids at that price]."""
    if not acc or bid[1] > acc[0]:
        return [bid[1], [bid]]
    if bid[1] == acc[0]:
        return [acc[0], acc[1] + [bid]]
    return acc


def merge_max(acc: list, other: list) -> list:
    """Two [price, bids at that price] into one."""
    if not acc or other[0] > acc[0]:
        return [other[0], list(other[1])]
    if other[0] == acc[0]:
        return [acc[0], acc[1] + other[1]]
    return acc


def q5() -> list[Stage]:
    # Bids per auction per sliding window, then per window the auctions with the most.
    def most(acc: list, row: list) -> list:
        auction, n = row
        if not acc or n > acc[0]:
            return [n, [auction]]
        return [n, acc[1] + [auction]] if n == acc[0] else acc

    return [
        Stage("bids", ["bid"], map=lambda b: [[b["auction"], b["dateTime"], 1]]),
        Stage("count", ["bids"], op=WindowOperator(sliding(WINDOW_MS, Q5_SLIDE_MS), lambda a, v: a + v, int)),
        Stage("by_window", ["count"], map=lambda o: [[o[1], o[2] - 1, [o[0], o[3]]]]),
        Stage("hottest", ["by_window"], op=WindowOperator(tumbling(Q5_SLIDE_MS), most, list)),
        Stage("rows", ["hottest"], map=lambda o: [[o[0], o[0] + WINDOW_MS, a, o[3][0]] for a in o[3][1]]),
    ]


def q7() -> list[Stage]:
    # The highest bids per auction per window, then per window the highest of those.
    return [
        Stage("bids", ["bid"], map=lambda b: [[b["auction"], b["dateTime"],
                                               [b["auction"], b["price"], b["bidder"], b["dateTime"]]]]),
        Stage("per_auction", ["bids"], op=WindowOperator(tumbling(WINDOW_MS), max_bids, list)),
        Stage("by_window", ["per_auction"], map=lambda o: [[o[1], o[2] - 1, o[3]]]),
        Stage("highest", ["by_window"], op=WindowOperator(tumbling(WINDOW_MS), merge_max, list)),
        Stage("rows", ["highest"], map=lambda o: [[o[0], o[0] + WINDOW_MS, *bid] for bid in o[3][1]]),
    ]


def once(state: list | None, value: list, timers) -> tuple[list | None, list]:
    # A person is joined once per auction of theirs in the window: keep the windows already reported until they end.
    if state and value[2] in state:
        return state, []
    timers.at(value[2] + WINDOW_MS, value[2])
    return (state or []) + [value[2]], [value]


def forget(state: list, t: float, start: int, timers) -> tuple[list | None, list]:
    rest = [s for s in state if s != start]
    return (rest or None), []


def q8() -> list[Stage]:
    def start(ts: int) -> int:
        return ts - ts % WINDOW_MS

    return [
        Stage("people", ["person"], map=lambda p: [[p["id"], p["dateTime"], [p["id"], p["name"],
                                                                              start(p["dateTime"])]]]),
        Stage("sellers", ["auction"], map=lambda a: [[a["seller"], a["dateTime"], a["id"]]]),
        Stage("join", ["people", "sellers"], op=WindowJoin(tumbling(WINDOW_MS))),
        Stage("by_person", ["join"], map=lambda o: [[o[0], o[1][2] + WINDOW_MS - 1, o[1]]]),
        Stage("distinct", ["by_person"], op=TimerOperator(once, forget)),
    ]


QUERIES: dict[str, Callable[[], list[Stage]]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q7": q7, "q8": q8}


def run(stages: list[Stage], events: list[dict], bound: float, batch: int = 1,
        restore_at: int | None = None, restore: Callable[[dict], dict] | None = None) -> tuple[list, int]:
    """Run `stages` in this process over `events` from one source partition whose watermark lags the newest event
    time by `bound`, moving it through the stages after every batch of `batch` events (each stage's outputs reach
    the later ones before the watermark does) and to +inf at the end. Before the batch holding event
    `restore_at`, every keyed stage's states go through `restore` (a checkpoint's serialization, say) into a
    fresh driver. Returns (the last
    stage's outputs, the records sent to late outputs)."""
    drivers = {s.name: KeyedDriver(s.op) for s in stages if s.op is not None}
    readers: dict[str, list] = {}
    for s in stages:
        for i, source in enumerate(s.inputs):
            readers.setdefault(source, []).append((s, i))
    last, out = stages[-1].name, []

    def emit(source: str, values: list) -> None:
        if source == last:
            out.extend(values)
        for stage, i in readers.get(source, ()):
            produced: list = []
            if stage.op is None:
                for v in values:
                    produced += stage.map(v)
            else:
                record = drivers[stage.name].record
                for v in values:
                    produced += record(v[0], v[1], v[2], i)[0]
            if produced:
                emit(stage.name, produced)

    def advance(watermark: float) -> None:
        for s in stages:
            if s.op is not None:
                emit(s.name, drivers[s.name].advance(watermark))

    clock = PartitionClock(bound)
    for start in range(0, len(events), batch):
        if restore is not None and restore_at is not None and start <= restore_at < start + batch:
            drivers = {name: KeyedDriver(d.op, restore(d.states), d.watermark, d.now) for name, d in drivers.items()}
        chunk = events[start:start + batch]
        # Within a batch the watermark stands still, so each kind's events may go on together.
        by_kind: dict[str, list] = {}
        for e in chunk:
            by_kind.setdefault(e["kind"], []).append(e)
        for kind, values in by_kind.items():
            emit(kind, values)
        clock.record_batch([e["dateTime"] for e in chunk], now=start)
        advance(clock.watermark)
    advance(POS_INF)
    return out, sum(d.late for d in drivers.values())


def answer(query: str, outputs: list) -> list:
    """The last stage's outputs, in the reference's canonical form."""
    if query in ("q0", "q1", "q2"):
        return list(outputs)
    if query == "q4":
        last = {o[0]: o for o in outputs}  # each category's running average, the last one is the answer
        return sorted(last.values())
    return sorted(outputs)
