"""The Nexmark event generator, seeded: people, auctions and bids as the benchmark's generator makes them.

It follows the generator of the Nexmark benchmark (its Beam and Flink versions): events are numbered; event `n`
happens at `base_time + n · 10⁶/rate µs` (in ms) and its kind is `n mod 50` against the proportions 1 : 3 : 46 (person,
auction, bid); ids start at 1000 and are derived from the event number, so a bid names an auction and a bidder
that exist or are at most 10 ahead; most auctions go to a few hot sellers, most bids to a few hot auctions and by a
few hot bidders (1 in `hot_*_ratio` is not hot); prices are `round(10^U(0,6) · 100)`; an auction lasts a random time
averaging the time in which `num_in_flight_auctions` more auctions start; each event carries an `extra` string
padding it to the spec's average size (100 bytes a bid, 200 a person, 500 an auction). With `out_of_order_group`
g > 1, each run of g events is emitted in a fixed pseudo-random order (the spec's `outOfOrderGroupSize`), so event
times are out of order by at most `max_out_of_order(config)` ms. The spec's generator draws from an unseeded Java
`Random`; this one from `random.Random(seed)`, so the same `(n, seed, config)` gives the same events.

An event is a dict with `kind` ("person", "auction" or "bid") and the spec's fields; times are ms since the epoch.
"""

from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
HOT_SELLER_RATIO = 100  # the hot seller / auction / bidder is the first of each run of 100 ids
HOT_AUCTION_RATIO = 100
HOT_BIDDER_RATIO = 100
US_STATES = ["AZ", "CA", "ID", "OR", "WA", "WY"]
US_CITIES = ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
             "Cheyenne"]
FIRST_NAMES = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"]
LAST_NAMES = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"]
_LETTERS = string.ascii_lowercase
# Random bytes mapped to letters (the spec draws a letter per character; a byte per character is as random for
# a padding string, and many times cheaper): every letter about equally often, and for names a space about 1 time
# in 13, as the spec's.
_BYTE_TO_LETTER = bytes((_LETTERS * 10).encode()[:256])
_BYTE_TO_SPACE_OR_LETTER = bytes((" " * 20 + _LETTERS * 10).encode()[:256])


@dataclass(frozen=True)
class Config:
    """The spec's defaults (its `NexmarkConfiguration`), with a fixed base time so runs repeat."""

    first_event_rate: int = 10_000  # events per second of event time
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    avg_person_byte_size: int = 200
    avg_auction_byte_size: int = 500
    avg_bid_byte_size: int = 100
    out_of_order_group: int = 1
    base_time: int = 1_700_000_000_000

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    @property
    def inter_event_delay_us(self) -> float:
        return 1_000_000.0 / self.first_event_rate

    def timestamp(self, event_number: int) -> int:
        return self.base_time + int(event_number * (1_000_000.0 / self.first_event_rate)) // 1000

    def adjusted_number(self, n: int) -> int:
        """The event number the n-th emitted event carries: a fixed permutation within each group."""
        g = self.out_of_order_group
        return (n // g) * g + (n * 953) % g

    def last_base0_person_id(self, event_id: int) -> int:
        epoch, offset = divmod(event_id, self.total_proportion)
        if offset >= self.person_proportion:
            offset = self.person_proportion - 1
        return epoch * self.person_proportion + offset

    def last_base0_auction_id(self, event_id: int) -> int:
        epoch, offset = divmod(event_id, self.total_proportion)
        if offset < self.person_proportion:
            epoch -= 1
            offset = self.auction_proportion - 1
        elif offset >= self.person_proportion + self.auction_proportion:
            offset = self.auction_proportion - 1
        else:
            offset -= self.person_proportion
        return epoch * self.auction_proportion + offset


def max_out_of_order(config: Config = Config()) -> int:
    """How far (ms) an event's time can be behind the latest time before it: a group's span of event time."""
    g = config.out_of_order_group
    return 0 if g <= 1 else int((g - 1) * config.inter_event_delay_us) // 1000 + 1


def _next_string(rng: random.Random, max_length: int) -> str:
    n = 3 + rng.randrange(max_length - 3)
    return rng.randbytes(n).translate(_BYTE_TO_SPACE_OR_LETTER).decode().strip()


def _next_extra(rng: random.Random, current_size: int, average: int) -> str:
    if current_size > average:
        return ""
    average -= current_size
    delta = int(math.floor(average * 0.2 + 0.5))  # Java's Math.round, not round-half-even
    size = average - delta + (rng.randrange(2 * delta) if delta else 0)
    return rng.randbytes(size).translate(_BYTE_TO_LETTER).decode()


def _next_price(rng: random.Random) -> int:
    return int(math.floor(10.0 ** (rng.random() * 6.0) * 100.0 + 0.5))


def _next_base0_person_id(cfg: Config, rng: random.Random, event_id: int) -> int:
    # An active person, or one of the next few not yet created (a person event "swapped" with its use).
    num_people = cfg.last_base0_person_id(event_id) + 1
    active = min(num_people, cfg.num_active_people)
    return num_people - active + rng.randrange(active + PERSON_ID_LEAD)


def _next_base0_auction_id(cfg: Config, rng: random.Random, event_id: int) -> int:
    last = cfg.last_base0_auction_id(event_id)
    lo = max(last - cfg.num_in_flight_auctions, 0)
    return lo + rng.randrange(last - lo + 1 + AUCTION_ID_LEAD)


def _person(cfg: Config, rng: random.Random, event_id: int, ts: int) -> dict:
    name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
    email = f"{_next_string(rng, 7)}@{_next_string(rng, 5)}.com"
    card = " ".join(f"{rng.randrange(10000):04d}" for _ in range(4))
    city, state = rng.choice(US_CITIES), rng.choice(US_STATES)
    size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
    return {"kind": "person", "id": cfg.last_base0_person_id(event_id) + FIRST_PERSON_ID, "name": name,
            "emailAddress": email, "creditCard": card, "city": city, "state": state, "dateTime": ts,
            "extra": _next_extra(rng, size, cfg.avg_person_byte_size)}


def _auction(cfg: Config, rng: random.Random, n: int, event_id: int, ts: int) -> dict:
    if rng.randrange(cfg.hot_sellers_ratio) > 0:
        seller = (cfg.last_base0_person_id(event_id) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO
    else:
        seller = _next_base0_person_id(cfg, rng, event_id)
    category = FIRST_CATEGORY_ID + rng.randrange(NUM_CATEGORIES)
    initial = _next_price(rng)
    # Long enough on average for num_in_flight_auctions more auctions to start meanwhile.
    events_ahead = cfg.num_in_flight_auctions * cfg.total_proportion // cfg.auction_proportion
    horizon = cfg.timestamp(cfg.adjusted_number(n) + events_ahead) - ts
    expires = ts + 1 + rng.randrange(max(horizon * 2, 1))
    name, desc = _next_string(rng, 20), _next_string(rng, 100)
    reserve = initial + _next_price(rng)
    size = 8 + len(name) + len(desc) + 8 + 8 + 8 + 8 + 8
    return {"kind": "auction", "id": cfg.last_base0_auction_id(event_id) + FIRST_AUCTION_ID, "itemName": name,
            "description": desc, "initialBid": initial, "reserve": reserve, "dateTime": ts, "expires": expires,
            "seller": seller + FIRST_PERSON_ID, "category": category,
            "extra": _next_extra(rng, size, cfg.avg_auction_byte_size)}


def _bid(cfg: Config, rng: random.Random, event_id: int, ts: int) -> dict:
    if rng.randrange(cfg.hot_auction_ratio) > 0:
        auction = (cfg.last_base0_auction_id(event_id) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    else:
        auction = _next_base0_auction_id(cfg, rng, event_id)
    if rng.randrange(cfg.hot_bidders_ratio) > 0:
        # The second of the run of 100, so that hot bidders are not the hot sellers.
        bidder = (cfg.last_base0_person_id(event_id) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    else:
        bidder = _next_base0_person_id(cfg, rng, event_id)
    return {"kind": "bid", "auction": auction + FIRST_AUCTION_ID, "bidder": bidder + FIRST_PERSON_ID,
            "price": _next_price(rng), "dateTime": ts, "extra": _next_extra(rng, 32, cfg.avg_bid_byte_size)}


def generate(n: int, seed: int = 0, config: Config = Config()) -> list[dict]:
    """The first `n` events, in emission order."""
    rng = random.Random(seed)
    cfg = config
    out = []
    for i in range(n):
        event_id = cfg.adjusted_number(i)
        ts = cfg.timestamp(event_id)
        rem = event_id % cfg.total_proportion
        if rem < cfg.person_proportion:
            out.append(_person(cfg, rng, event_id, ts))
        elif rem < cfg.person_proportion + cfg.auction_proportion:
            out.append(_auction(cfg, rng, i, event_id, ts))
        else:
            out.append(_bid(cfg, rng, event_id, ts))
    return out
