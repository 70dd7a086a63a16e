"""The Nexmark queries Q0-Q5, Q7 and Q8 as Bytewax 0.21 dataflows, beside clasp's (clasp/apps/nexmark/).

`build(query, source, sink, bound_ms)` is the dataflow reading events (the dicts of `clasp.apps.nexmark.generate`)
from any Bytewax source and writing the query's rows to any sink; `answer(query, rows)` puts what the sink got in
the reference's canonical form (`clasp.apps.nexmark.reference`), so that on the same events
`answer(q, rows) == reference.QUERIES[q](events)` (tests/unit/test_nexmark_bytewax.py).

Event time is Bytewax's `EventClock` on each event's `dateTime`, waiting `bound_ms` and never advanced by the
system clock (a fixed `now_getter`, no wake-ups): its watermarks then depend on the events alone, as clasp's do,
and a run is exact whatever the host's speed. Bytewax keeps a clock per key, so a key's windows close when that
key's events pass their end, or at the end of the input. `bound_ms` is the disorder the windowing steps see: the
generator's `max_out_of_order`, plus, where a step reads two streams merged (Q8's people and auctions), the event
time one input batch spans, since a merge may deliver one stream's part of a batch before the other's (a person
behind an auction of theirs from later in the same batch would be late).

How each query is written, at Bytewax's best (unordered folds where the fold does not care; each step that picks
one kind of event does it in the same call that maps or keys it, one `filter_map`, as clasp's maps do; the JSON
text is decoded with orjson where it is installed, as clasp's `FileSource` does, else `json.loads`; where the
benchmark selects lines by their text before decoding (`build`'s `select`: Q3 and Q8, as clasp's `FileSource(select=
...)`), the test and the decoding are one `filter_map`):
- Q0-Q2: one `filter_map` over the events.
- Q3: Bytewax's `join` either re-emits a key's whole product on each value ("running") or emits only at the end of
  the input ("final"), so the incremental person-auction join is a `stateful_flat_map` per seller, fed by a
  `filter_map` per side that tests the event's kind and the side's condition in one call.
- Q4: auctions and bids keyed by auction in one `filter_map`, an auction's bids folded per auction (`fold_final`:
  Bytewax has no event-time timer per key, so auctions close at the end of the input, and the bids ahead of an
  auction that never comes are kept to the end), then averaged per category (`fold_final`).
- Q5: bids counted per auction in 10 s windows sliding by 2 s (`fold_window`, `SlidingWindower`), then per window
  the auctions with the most, updated as counts arrive (`stateful_map`; the last update is the answer).
- Q7: the highest bids per auction in 10 s tumbling windows (`fold_window`, `TumblingWindower`), then per window
  the highest of those (`stateful_map`).
- Q8: people and auctions joined per person in 10 s tumbling windows (`join_window`, emitted when a window closes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream
from bytewax.operators.windowing import EventClock, SlidingWindower, TumblingWindower, fold_window, join_window

from clasp.apps.nexmark.queries import better_bid, merge_max
from clasp.apps.nexmark.reference import Q2_MODULUS, Q3_CATEGORY, Q3_STATES, Q5_SLIDE_MS, WINDOW_MS, euros

try:
    from orjson import loads
except ImportError:  # orjson is one of clasp's dependencies; a Bytewax-only environment may lack it
    loads = json.loads

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)


def _event_time(e: dict) -> datetime:
    return EPOCH + e["dateTime"] * MS


def _frozen_now() -> datetime:
    return EPOCH


def _no_wake_up(_: datetime) -> None:
    return None


def clock(bound_ms: int) -> EventClock:
    return EventClock(_event_time, wait_for_system_duration=bound_ms * MS, now_getter=_frozen_now,
                      to_system_utc=_no_wake_up)


def _keyed(events: Stream, kind: str, field: str) -> Stream:
    """The events of one kind keyed by one field, in one call per event (a filter then a key_on is two)."""
    return op.filter_map(f"{kind}s_by_{field}", events, lambda e: (str(e[field]), e) if e["kind"] == kind else None)


def _bid_row(b: dict) -> list:
    return [b["auction"], b["bidder"], b["price"], b["dateTime"], b["extra"]]


def q0(events: Stream, bound_ms: int) -> Stream:
    return op.filter_map("q0", events, lambda e: _bid_row(e) if e["kind"] == "bid" else None)


def q1(events: Stream, bound_ms: int) -> Stream:
    return op.filter_map("q1", events, lambda b: [b["auction"], b["bidder"], euros(b["price"]), b["dateTime"],
                                                  b["extra"]] if b["kind"] == "bid" else None)


def q2(events: Stream, bound_ms: int) -> Stream:
    return op.filter_map("q2", events, lambda b: [b["auction"], b["price"]]
                         if b["kind"] == "bid" and b["auction"] % Q2_MODULUS == 0 else None)


def _seller_join(state: list | None, value: tuple) -> tuple[list, list]:
    person, auctions = state or (None, [])
    side, body = value
    if side == "p":
        return [body, []], [[*body, a] for a in auctions]
    if person is not None:
        return [person, []], [[*person, body]]
    return [None, auctions + [body]], []


def q3(events: Stream, bound_ms: int) -> Stream:
    # Each side's kind and condition in one step, a call per event, as clasp's maps do.
    people = op.filter_map("people", events, lambda p: (
        str(p["id"]), ("p", [p["name"], p["city"], p["state"]]))
        if p["kind"] == "person" and p["state"] in Q3_STATES else None)
    auctions = op.filter_map("sellers", events, lambda a: (
        str(a["seller"]), ("a", a["id"])) if a["kind"] == "auction" and a["category"] == Q3_CATEGORY else None)
    joined = op.stateful_flat_map("join", op.merge("both", people, auctions), _seller_join)
    return op.map("rows", joined, lambda kv: kv[1])


def _auction_fold(state: dict, value: tuple) -> dict:
    kind, ts, body = value
    if kind == "auction":
        state["terms"] = body
        for bts, price in state["early"]:
            state["best"] = better_bid(body, state["best"], bts, price)
        state["early"] = []
    elif state["terms"] is not None:
        state["best"] = better_bid(state["terms"], state["best"], ts, body)
    else:
        state["early"].append((ts, body))
    return state


def _auction_or_bid(e: dict) -> tuple | None:
    kind = e["kind"]
    if kind == "bid":
        return str(e["auction"]), ("bid", e["dateTime"], e["price"])
    if kind == "auction":
        return str(e["id"]), ("auction", e["dateTime"], [e["dateTime"], e["expires"], e["category"], e["reserve"]])
    return None


def q4(events: Stream, bound_ms: int) -> Stream:
    # Auctions and bids keyed in one call an event, as clasp's one map does.
    closed = op.fold_final("close", op.filter_map("auctions_and_bids", events, _auction_or_bid),
                           lambda: {"terms": None, "best": None, "early": []}, _auction_fold)
    prices = op.filter_map("prices", closed, lambda kv: (str(kv[1]["terms"][2]), kv[1]["best"])
                           if kv[1]["terms"] is not None and kv[1]["best"] is not None else None)
    sums = op.fold_final("average", prices, lambda: [0, 0], lambda s, p: [s[0] + 1, s[1] + p])
    return op.map("rows", sums, lambda kv: [int(kv[0]), kv[1][0], kv[1][1], kv[1][1] / kv[1][0]])


def _most(state: list | None, row: tuple) -> tuple[list, list]:
    auction, n = row
    if state is None or n > state[0]:
        state = [n, [auction]]
    elif n == state[0]:
        state = [n, state[1] + [auction]]
    return state, state


def q5(events: Stream, bound_ms: int) -> Stream:
    bids = _keyed(events, "bid", "auction")
    counts = fold_window("count", bids, clock(bound_ms),
                         SlidingWindower(WINDOW_MS * MS, Q5_SLIDE_MS * MS, EPOCH),
                         int, lambda n, _: n + 1, lambda a, b: a + b, ordered=False)
    by_window = op.map("by_window", counts.down, lambda kv: (str(kv[1][0]), (int(kv[0]), kv[1][1])))
    hottest = op.stateful_map("hottest", by_window, _most)
    return op.map("rows", hottest, lambda kv: [int(kv[0]) * Q5_SLIDE_MS, kv[1][0], kv[1][1]])


def _max_bids(acc: list, bid: dict) -> list:
    row = [bid["auction"], bid["price"], bid["bidder"], bid["dateTime"]]
    if not acc or row[1] > acc[0]:
        return [row[1], [row]]
    return [acc[0], acc[1] + [row]] if row[1] == acc[0] else acc


def _highest(state: list | None, acc: list) -> tuple[list, list]:
    state = merge_max(state or [], acc)
    return state, state


def q7(events: Stream, bound_ms: int) -> Stream:
    bids = _keyed(events, "bid", "auction")
    per_auction = fold_window("per_auction", bids, clock(bound_ms), TumblingWindower(WINDOW_MS * MS, EPOCH),
                              list, _max_bids, merge_max, ordered=False)
    by_window = op.map("by_window", per_auction.down, lambda kv: (str(kv[1][0]), kv[1][1]))
    highest = op.stateful_map("highest", by_window, _highest)
    return op.map("rows", highest, lambda kv: [int(kv[0]) * WINDOW_MS, kv[1]])


def q8(events: Stream, bound_ms: int) -> Stream:
    people = _keyed(events, "person", "id")
    sellers = _keyed(events, "auction", "seller")
    joined = join_window("join", clock(bound_ms), TumblingWindower(WINDOW_MS * MS, EPOCH), people, sellers,
                         insert_mode="first", emit_mode="final", ordered=False)
    return op.filter_map("rows", joined.down, lambda kv: [kv[1][1][0]["id"], kv[1][1][0]["name"],
                                                          kv[1][0] * WINDOW_MS]
                         if kv[1][1][0] is not None and kv[1][1][1] is not None else None)


QUERIES: dict[str, Callable[[Stream, int], Stream]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q7": q7, "q8": q8}


def _decode_selected(select: list[str]) -> Callable[[str], dict | None]:
    """A line decoded if it holds one of `select`'s strings, else None: one call a line, as one step."""
    if len(select) == 1:
        (a,) = select
        return lambda line: loads(line) if a in line else None
    return lambda line: loads(line) if any(s in line for s in select) else None


def build(query: str, source, sink, bound_ms: int = 0, decode: bool = False,
          select: list[str] | None = None) -> Dataflow:
    """The query's dataflow; `decode`: the source gives the events as JSON text, each decoded first, or with
    `select` only the lines that hold one of its strings (the others dropped undecoded, in the same step)."""
    flow = Dataflow(f"nexmark_{query}")
    events = op.input("events", flow, source)
    if decode and select:
        events = op.filter_map("decode", events, _decode_selected(select))
    elif decode:
        events = op.map("decode", events, loads)
    op.output("out", QUERIES[query](events, bound_ms), sink)
    return flow


def answer(query: str, rows: list) -> list:
    """What the sink got, in the reference's canonical form: Q5 and Q7 send each window's answer again as it
    improves, the last is the answer."""
    if query in ("q0", "q1", "q2"):
        return list(rows)
    if query == "q5":
        last = {start: (n, auctions) for start, n, auctions in rows}
        return sorted([start, start + WINDOW_MS, a, n] for start, (n, auctions) in last.items() for a in auctions)
    if query == "q7":
        last = {start: acc for start, acc in rows}
        return sorted([start, start + WINDOW_MS, *bid] for start, acc in last.items() for bid in acc[1])
    return sorted(rows)
