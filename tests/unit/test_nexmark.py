"""Nexmark without a runtime: the generator against the spec (deterministic, 1 : 3 : 46, ids and times as the spec
derives them, out of order only within its bound), the reference queries on a small hand-checked input, and the
same queries run as stages of windows, joins and timers (clasp.windows) giving the reference's answers on generated
events, in order and out of order, with every stage's states serialized mid-stream."""

from __future__ import annotations

import collections
import json
import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.apps import nexmark as nx
from clasp.apps.nexmark import reference as ref

# Small rates so that a few thousand events span many 10-second windows.
SLOW = nx.Config(first_event_rate=100)
SLOW_SHUFFLED = nx.Config(first_event_rate=100, out_of_order_group=40)


# ---------------------------------------------------------------------------------------------- generator


def test_the_generator_is_deterministic_per_seed():
    assert nx.generate(2000, 7) == nx.generate(2000, 7)
    assert nx.generate(2000, 7) != nx.generate(2000, 8)
    assert nx.generate(2000, 7)[:500] == nx.generate(500, 7)


def test_people_auctions_and_bids_come_1_3_46_with_the_spec_s_ids_and_times():
    cfg = nx.Config()
    events = nx.generate(5000, 3)
    kinds = [e["kind"] for e in events]
    assert collections.Counter(kinds) == {"person": 100, "auction": 300, "bid": 4600}
    assert kinds[:50] == ["person"] + ["auction"] * 3 + ["bid"] * 46
    # Event n happens at base + n·100 µs (10,000 events/s): ten events per millisecond, in order.
    assert [e["dateTime"] for e in events] == [cfg.base_time + n // 10 for n in range(5000)]
    people = [e for e in events if e["kind"] == "person"]
    auctions = [e for e in events if e["kind"] == "auction"]
    assert [p["id"] for p in people] == list(range(1000, 1100))
    assert [a["id"] for a in auctions] == list(range(1000, 1300))
    last_person, last_auction = 999, 999
    for e in events:
        if e["kind"] == "person":
            last_person = e["id"]
            assert e["state"] in nx.generator.US_STATES and e["city"] in nx.generator.US_CITIES
        elif e["kind"] == "auction":
            last_auction = e["id"]
            assert 1000 <= e["seller"] <= last_person + 10 and 10 <= e["category"] <= 14
            assert e["reserve"] > e["initialBid"] >= 100 and e["expires"] > e["dateTime"]
        else:
            # A bid names an auction and a bidder that exist or are at most 10 ahead (the spec's leads).
            assert 1000 <= e["auction"] <= last_auction + 10 and 1000 <= e["bidder"] <= last_person + 10
            assert 100 <= e["price"] <= 100_000_000
    # Hot auctions and bidders: half the bids go to the first auction of the last run of 100 (hot ratio 2).
    bids = [e for e in events if e["kind"] == "bid"]
    hot = sum(b["auction"] == 1000 + ((b["auction"] - 1000) // 100) * 100 for b in bids) / len(bids)
    assert 0.45 < hot < 0.6
    # The padding brings each kind to about the spec's average size (msgpack of the whole event here).
    for kind, size in (("person", 200), ("auction", 500), ("bid", 100)):
        mean = sum(len(e["extra"]) for e in events if e["kind"] == kind) / kinds.count(kind)
        fixed = {"person": 55, "auction": 80, "bid": 32}[kind]
        assert 0.85 * size < mean + fixed < 1.15 * size, (kind, mean)


def test_out_of_order_groups_permute_event_times_within_the_bound():
    cfg = nx.Config(out_of_order_group=100)
    events = nx.generate(20_000, 1, cfg)
    bound = nx.max_out_of_order(cfg)
    assert bound == 10  # a group of 100 events spans 9.9 ms
    top, behind = 0, []
    for e in events:
        behind.append(top - e["dateTime"])
        top = max(top, e["dateTime"])
    assert max(behind[1:]) <= bound and max(behind[1:]) >= bound - 2  # out of order, never beyond the bound
    assert sorted(e["dateTime"] for e in events) == [cfg.base_time + n // 10 for n in range(20_000)]
    assert collections.Counter(e["kind"] for e in events) == {"person": 400, "auction": 1200, "bid": 18_400}
    assert nx.max_out_of_order(nx.Config()) == 0


# ---------------------------------------------------------------------------------------------- a hand-checked input


def person(i, name, city, state, t):
    return {"kind": "person", "id": i, "name": name, "emailAddress": "", "creditCard": "", "city": city,
            "state": state, "dateTime": t, "extra": ""}


def auction(i, seller, category, t, expires, reserve):
    return {"kind": "auction", "id": i, "itemName": "", "description": "", "initialBid": 1, "reserve": reserve,
            "dateTime": t, "expires": expires, "seller": seller, "category": category, "extra": ""}


def bid(a, bidder, price, t):
    return {"kind": "bid", "auction": a, "bidder": bidder, "price": price, "dateTime": t, "extra": "x"}


HAND = [
    person(1000, "Ann A", "Portland", "OR", 1000),
    auction(2000, 1000, 10, 1500, 9000, 100),
    person(1001, "Bob B", "Seattle", "WA", 2000),
    auction(2001, 1001, 10, 2500, 15000, 50),
    bid(2000, 1001, 150, 3000),
    bid(2000, 1002, 90, 4000),    # below 2000's reserve
    bid(2001, 1000, 70, 5000),
    bid(2000, 1001, 300, 9500),   # after 2000 expired
    person(1002, "Cid C", "Boise", "ID", 12000),
    auction(2002, 1002, 11, 12500, 20000, 10),
    auction(2460, 1002, 10, 13000, 14000, 500),  # 2460 = 20 · 123
    bid(2460, 1000, 600, 13500),
    bid(2460, 1001, 400, 13600),  # below reserve
    bid(2002, 1000, 600, 16000),
]

HAND_ANSWERS = {
    "q0": [[b["auction"], b["bidder"], b["price"], b["dateTime"], "x"] for b in HAND if b["kind"] == "bid"],
    "q1": [[b["auction"], b["bidder"], 0.908 * b["price"], b["dateTime"], "x"] for b in HAND if b["kind"] == "bid"],
    "q2": [[2460, 600], [2460, 400]],
    "q3": [["Ann A", "Portland", "OR", 2000], ["Cid C", "Boise", "ID", 2460]],
    # category 10: 2000 at 150, 2001 at 70, 2460 at 600; category 11: 2002 at 600.
    "q4": [[10, 3, 820, 820 / 3], [11, 1, 600, 600.0]],
    "q5": sorted([
        [-6000, 4000, 2000, 1], [-4000, 6000, 2000, 2], [-2000, 8000, 2000, 2], [0, 10000, 2000, 3],
        [2000, 12000, 2000, 3], [4000, 14000, 2000, 2], [4000, 14000, 2460, 2], [6000, 16000, 2460, 2],
        [8000, 18000, 2460, 2], [10000, 20000, 2460, 2], [12000, 22000, 2460, 2], [14000, 24000, 2002, 1],
        [16000, 26000, 2002, 1]]),
    "q7": [[0, 10000, 2000, 300, 1001, 9500], [10000, 20000, 2002, 600, 1000, 16000],
           [10000, 20000, 2460, 600, 1000, 13500]],
    "q8": [[1000, "Ann A", 0], [1001, "Bob B", 0], [1002, "Cid C", 10000]],
}


@pytest.mark.parametrize("query", sorted(HAND_ANSWERS))
def test_each_reference_query_gives_the_hand_checked_answer(query):
    assert nx.QUERIES[query](HAND) == HAND_ANSWERS[query]


# ---------------------------------------------------------------------------------------------- the stages


def _through_msgpack(states: dict) -> dict:
    return dict(msgpack.unpackb(msgpack.packb(list(states.items())), strict_map_key=False))


def run_stages(stages, events, bound, snapshot_at=None, batch=1):
    """`nx.run`, every keyed stage's states through msgpack at `snapshot_at` (a checkpoint's, a migration's)."""
    return nx.run(stages, events, bound, batch, snapshot_at, _through_msgpack)


@pytest.mark.parametrize("query", sorted(HAND_ANSWERS))
def test_the_stages_of_each_query_give_the_hand_checked_answer_in_order_and_shuffled_within_a_bound(query):
    stages = nx.STAGES[query]()
    out, late = run_stages(stages, HAND, bound=0)
    assert (nx.answer(query, out), late) == (HAND_ANSWERS[query], 0)
    rng = random.Random(5)
    shuffled = sorted(HAND, key=lambda e: e["dateTime"] + rng.randrange(3000))
    out, late = run_stages(nx.STAGES[query](), shuffled, bound=3000, snapshot_at=7)
    want = nx.QUERIES[query](shuffled)  # Q0-Q2 keep the input order
    assert (nx.answer(query, out), late) == (want, 0)


@pytest.mark.parametrize("config,batch", [(SLOW, 1), (SLOW_SHUFFLED, 1), (SLOW_SHUFFLED, 250)],
                         ids=["in_order", "out_of_order", "out_of_order_batches"])
@pytest.mark.parametrize("query", sorted(nx.QUERIES))
def test_the_stages_of_each_query_equal_the_reference_on_generated_events(query, config, batch):
    events = nx.generate(6000, 11, config)
    want = nx.QUERIES[query](events)
    assert want  # every query has answers at this size
    out, late = run_stages(nx.STAGES[query](), events, nx.max_out_of_order(config), snapshot_at=3000, batch=batch)
    assert late == 0
    assert nx.answer(query, out) == want


def test_windowed_answers_span_many_windows_at_the_test_rate():
    events = nx.generate(6000, 11, SLOW)
    assert len({r[0] for r in ref.q7(events)}) >= 5 and len({r[0] for r in ref.q5(events)}) >= 25
    assert len(ref.q8(events)) >= 15 and len(ref.q3(events)) >= 10 and len(ref.q4(events)) == 5


def test_the_in_process_benchmark_checks_every_answer(tmp_path):
    from clasp.bench.nexmark import main

    out = tmp_path / "nexmark.json"
    assert main(["--events", "4000", "--batch", "500", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["query"] for r in rows] == list(nx.QUERIES)
    assert all(r["clasp_exact"] and r["clasp_events_per_s"] > 0 for r in rows)


@pytest.mark.parametrize("order", ["rising", "falling", "shuffled"])
def test_q4s_early_bids_share_one_timer_at_the_earliest_kept_in_the_state(order):
    """Bids ahead of their auction: one "early" timer, at the earliest of them, whose time the state keeps
    (`armed`), so no bid looks for it among the timers; the auction cancels it and takes the valid bids."""
    from clasp.apps.nexmark.queries import ARMED, BEST, EARLY, auction_fn, auction_timer
    from clasp.windows import KeyedDriver, TimerOperator, after

    times = [1000 + 7 * i for i in range(12)]
    if order == "falling":
        times.reverse()
    elif order == "shuffled":
        random.Random(3).shuffle(times)
    driver = KeyedDriver(TimerOperator(auction_fn, auction_timer))
    for i, ts in enumerate(times):
        driver.record(1, ts, [1, ts, 500 + 10 * i])
        state, timers = driver.states[1]
        early = [t for t, _, payload in timers if payload == "early"]
        assert early == [after(min(times[:i + 1]))] == [state[ARMED]]
    # The auction opens at 1030 (bids before it do not count), expires at 1060, reserve 560.
    driver.record(1, 1030, [1, 1030, [1030, 1060, 7, 560]])
    state, timers = driver.states[1]
    assert state[ARMED] is None and not state[EARLY]
    assert [payload for _, _, payload in timers] == ["close"]
    want = max(500 + 10 * i for i, ts in enumerate(times) if 1030 <= ts <= 1060 and 500 + 10 * i >= 560)
    assert state[BEST] == want
    assert driver.advance(2000) == [[7, 1060, want]] and driver.states == {}


def test_q4s_early_bids_whose_auction_never_comes_are_forgotten_one_timer_at_a_time():
    from clasp.apps.nexmark.queries import ARMED, EARLY, auction_fn, auction_timer
    from clasp.windows import KeyedDriver, TimerOperator, after

    driver = KeyedDriver(TimerOperator(auction_fn, auction_timer))
    for ts in (300, 100, 200):
        driver.record(9, ts, [9, ts, ts])
    assert driver.advance(150) == []
    state, timers = driver.states[9]
    assert state[EARLY] == [[[300, 300], [200, 200]]] and state[ARMED] == after(200)
    assert timers == [[after(200), "event", "early"]]
    assert driver.advance(1000) == [] and driver.states == {}


@st.composite
def _q4_arrivals(draw):
    """A few auctions and their bids (some early, late, below the reserve, or on an auction that never comes),
    and an arrival order out of event order by up to a bound."""
    bound = draw(st.integers(0, 50))
    events = []
    for a in range(draw(st.integers(1, 4))):
        opened = draw(st.integers(0, 100))
        expires = opened + draw(st.integers(0, 60))
        if draw(st.booleans()) or a == 0:
            events.append(auction(100 + a, 1, draw(st.integers(10, 12)), opened, expires, draw(st.integers(0, 50))))
        for _ in range(draw(st.integers(0, 6))):
            events.append(bid(100 + a, 1, draw(st.integers(0, 80)), draw(st.integers(0, 180))))
    # Each event arrives once the newest before it is at most `bound` later: sorted by time plus a lag < bound.
    lags = [draw(st.integers(0, bound)) for _ in events]
    order = sorted(range(len(events)), key=lambda i: (events[i]["dateTime"] + lags[i], i))
    return [events[i] for i in order], bound


@settings(max_examples=300, deadline=None)
@given(arrivals=_q4_arrivals(), batch=st.integers(1, 5), snapshot_at=st.integers(0, 30))
def test_q4s_stages_equal_the_reference_under_any_arrival_order_within_the_bound(arrivals, batch, snapshot_at):
    """Auctions closed at their expiry from bids before, after or without their auction, in any order the bound
    allows, each stage's states through msgpack midway: the reference's answer, no record late."""
    events, bound = arrivals
    out, late = run_stages(nx.STAGES["q4"](), events, bound, snapshot_at=snapshot_at, batch=batch)
    assert (nx.answer("q4", out), late) == (ref.q4(events), 0)


def test_the_cluster_benchmark_draws_a_saved_run(tmp_path):
    """`--replot` draws the saved table's clasp rows, one bar per query and worker count, as a PNG."""
    from clasp.bench import nexmark_cluster

    table = [{"query": q, "system": "clasp", "workers": n, "over_bytewax_processes": r}
             for q, n, r in (("q0", 1, 1.5), ("q0", 2, 1.6), ("q2", 1, 0.9), ("q2", 2, 1.1))]
    table.append({"query": "q0", "system": "bytewax-processes", "workers": 1, "events_per_s": 1.0})
    saved, png = tmp_path / "run.json", tmp_path / "run.png"
    saved.write_text(json.dumps({"runs": [], "fixed": [], "table": table}))
    assert nexmark_cluster.main(["--replot", str(saved), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
