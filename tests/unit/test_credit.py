"""The credit arithmetic of the planner's byte-bounded queue (clasp.core.credit), with no sockets."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clasp.core.credit import (
    CHUNK_BYTES,
    CHUNK_RECORDS,
    FIRST_CHUNK,
    RECORD_OVERHEAD,
    ByteQueue,
    PushCredit,
    QueueBound,
    charge,
    chunk_records,
    drain_rate,
    share,
)


def test_charge_is_the_frame_plus_an_overhead_per_record():
    assert charge(1000, 10) == 1000 + 10 * RECORD_OVERHEAD
    assert charge(0, 0) == 0


@given(st.integers(0, 10**9), st.lists(st.integers(1, 50), min_size=1, max_size=30))
def test_shares_of_a_chunk_taken_in_any_steps_sum_to_its_charge(total, steps):
    size = sum(steps)
    start, parts = 0, []
    for k in steps:
        parts.append(share(total, size, start, k))
        start += k
    assert sum(parts) == total
    assert all(p >= 0 for p in parts)


def test_byte_queue_gives_back_exactly_what_was_admitted():
    q = ByteQueue()
    q.admit(1000)  # a chunk of 3 records
    q.admit(10)  # a chunk of 1
    assert q.total == 1010
    assert q.taken(3, 0, 1) == 333
    assert q.taken(3, 1, 2) == 667  # the chunk leaves with its last record
    assert len(q) == 1 and q.total == 10
    assert q.taken(1, 0, 1) == 10
    assert q.total == 0 and len(q) == 0
    assert q.taken(5, 0, 1) == 0  # nothing queued: nothing leaves


def test_bound_within_and_credit():
    b = QueueBound(max_records=100, max_bytes=1000)
    assert b.within(100, 1000)
    assert not b.within(101, 0)
    assert not b.within(0, 1001)
    assert b.credit(400) == 600
    assert b.credit(5000) == 0
    assert b.chunk_bytes() == 125
    assert QueueBound().chunk_bytes() == CHUNK_BYTES


def test_chunk_records_follows_the_measured_record_size():
    assert chunk_records(1 << 20, None) == FIRST_CHUNK
    assert chunk_records(1 << 20, 10.0) == CHUNK_RECORDS  # small records: the count cap
    assert chunk_records(1 << 20, 100.0) == (1 << 20) // 100  # the byte target
    assert chunk_records(1 << 20, 4096.0 + RECORD_OVERHEAD) == 252
    assert chunk_records(1000, 1e9) == 1  # one record larger than the target: one at a time
    assert chunk_records(1 << 20, 0.0, most=7) == 7


def test_push_credit_one_at_a_time_until_the_first_ack():
    c = PushCredit(window=8)
    assert c.may_send(10**9)  # nothing in flight: always one
    c.sent(1, 500, 5)
    assert not c.may_send(1)  # no credit known yet
    c.acked(1, credit=1000, bound=8000)
    assert c.target == 1000 and c.per_record == 100.0
    c.sent(2, 600, 6)
    assert c.may_send(400) and not c.may_send(401)
    c.sent(3, 400, 4)
    assert c.oldest() == 2 and c.inflight_bytes == 1000
    c.acked(2, credit=0, bound=8000)  # the planner at its bound: nothing more than one in flight
    assert not c.may_send(1)
    c.acked(3, credit=5000, bound=8000)
    assert c.inflight_bytes == 0 and c.may_send(10**9)


def test_push_credit_window_and_a_planner_without_credit():
    c = PushCredit(window=2)
    c.sent(1, 10, 1)
    c.acked(1, credit=None)  # an older planner: the count window alone
    c.sent(2, 10**9, 1)
    assert c.may_send(10**9)
    c.sent(3, 10**9, 1)
    assert not c.may_send(1)  # window full


@given(st.integers(1, 5000), st.lists(st.integers(1, 3000), min_size=1, max_size=200), st.integers(0, 10**6))
def test_one_client_keeps_the_queue_within_the_bound_plus_one_chunk(max_bytes, chunks, seed):
    """A model of one client and the planner: the planner acks while within the bound (else defers), with
    the credit then; it drains some bytes between messages. The queue never passes bound + one chunk."""
    import random

    rnd = random.Random(seed)
    bound = QueueBound(10**9, max_bytes)
    client = PushCredit(window=8)
    queue = 0
    wire: list[tuple[int, int]] = []  # sent, not yet received by the planner
    deferred: list[int] = []
    acks: list[tuple[int, int]] = []  # (req, credit) sent back, not yet read
    pending = list(chunks)
    req = 0
    biggest = max(chunks)
    while pending or client.inflight:
        if pending and client.may_send(pending[0]):
            req += 1
            client.sent(req, pending[0], 1)
            wire.append((req, pending.pop(0)))
        elif acks:
            r, cr = acks.pop(0)
            client.acked(r, cr, max_bytes)
        # the planner receives some of what is on the wire
        while wire and rnd.random() < 0.7:
            r, b = wire.pop(0)
            queue += b
            if deferred or not bound.within(0, queue):
                deferred.append(r)
            else:
                acks.append((r, bound.credit(queue)))
        assert queue <= max_bytes + biggest
        queue = max(0, queue - rnd.randint(0, 2 * biggest))  # dispatch drains some
        while deferred and bound.within(0, queue):
            acks.append((deferred.pop(0), bound.credit(queue)))
        if not wire and not acks and not deferred and client.inflight and not (pending and client.may_send(pending[0])):
            break  # everything acked that can be (nothing stuck)
    assert not pending


def test_parse_size():
    from clasp.core.credit import parse_size

    assert parse_size("128M") == 128 << 20
    assert parse_size("256k") == 256 << 10
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("4096") == 4096
    for bad in ("0", "-1", "x", "M"):
        try:
            parse_size(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_forget_drops_what_was_in_flight():
    c = PushCredit()
    c.sent(1, 100, 1)
    c.forget()
    assert c.inflight_bytes == 0 and not c.inflight and c.may_send(10**9)


def test_the_time_bound_is_what_the_drain_rate_empties_in_max_delay_within_floor_and_bytes():
    b = QueueBound(max_bytes=128 << 20, max_delay=2.0)
    assert b.floor() == 8 * CHUNK_BYTES
    assert b.limit(None) == b.floor()  # not measured yet: no trust in 128 MB
    assert b.limit(10e6) == 20_000_000
    assert b.limit(1e3) == b.floor()
    assert b.limit(1e9) == 128 << 20
    assert QueueBound(max_bytes=128 << 20).limit(1e3) == 128 << 20  # max_delay 0: the bytes alone
    assert QueueBound(max_bytes=1 << 20, max_delay=2.0).limit(None) == 1 << 20  # a floor never above the bound
    assert b.within(10, 20_000_000, b.limit(10e6)) and not b.within(10, 20_000_001, b.limit(10e6))


@given(st.floats(0, 1e10), st.floats(0, 1e3), st.integers(1, 1 << 40))
def test_a_limit_is_always_between_the_floor_and_the_bound(rate, delay, max_bytes):
    b = QueueBound(max_bytes=max_bytes, max_delay=delay)
    lim = b.limit(rate or None)
    assert min(b.floor(), max_bytes) <= lim <= max_bytes


def test_the_drain_rate_averages_ticks_with_a_backlog_only():
    r = drain_rate(None, 0, 1.0, backlog=False)
    assert r is None  # nothing queued: the dispatch waited for input, no measure
    r = drain_rate(None, 1000, 0.5, backlog=True)
    assert r == 2000
    r = drain_rate(r, 4000, 1.0, backlog=True)
    assert 2000 < r < 4000  # a faster tick: a moving average up
    assert drain_rate(r, 0, 1.0, backlog=False) == r
    assert drain_rate(r, 500, 1.0, backlog=True) == 500  # a slower one: at once down


@given(st.integers(0, 1 << 30), st.integers(0, 1 << 30), st.integers(1, 64))
def test_clients_sharing_a_credit_never_overshoot_the_limit_together(limit, queued, k):
    b = QueueBound(max_bytes=1 << 30)
    assert k * b.credit(queued, limit, clients=k) <= max(0, limit - queued)


def test_a_source_window_holds_what_the_worker_completes_in_its_span_within_its_bounds():
    from clasp.core.credit import source_window

    assert source_window(300_000, 1.0, 4096, 16384, 0.05) == 15000  # a fast worker: 50 ms of its records
    assert source_window(30_000, 1.0, 4096, 16384, 0.05) == 4096  # a slow one: the least
    assert source_window(10**7, 1.0, 4096, 16384, 0.05) == 16384  # never beyond the most
    assert source_window(10**7, 1.0, 4096, 2048, 0.05) == 2048  # a most below the least is the window
    assert source_window(0, 0.0, 4096, 16384, 0.05) == 4096
    # credit that comes back 50 ms after the records were read: the window covers that cycle too
    assert source_window(300_000, 1.0, 4096, 65536, 0.05, cycle=0.05) == 30000


def test_a_window_the_credit_limits_grows_until_the_worker_sets_the_rate():
    """A closed loop: the window's records come back as credit one cycle (60 ms, longer than the span) after
    they are read, or later once the worker (capacity per second) is the limit. Without the cycle counted in,
    the window sinks to the least; with it, it grows to what the worker completes in a cycle and a span."""
    from clasp.core.credit import source_window

    def settle(with_cycle: bool, capacity: float = 400_000, cycle: float = 0.06) -> int:
        window = 8192
        for _ in range(50):
            seconds = max(cycle, window / capacity)  # a window's turn: the credit's cycle, or the work
            window = source_window(window, seconds, 4096, 65536, 0.05, cycle if with_cycle else 0.0)
        return window

    assert settle(False) == 4096  # the fixed point of the rate the window itself allows
    assert settle(True) == 44000  # what the worker completes in the cycle and the span: 400,000 a second, 110 ms
    assert settle(True, capacity=100_000) == 11000  # a slower worker: what it completes in 110 ms


def test_the_credit_cycle_is_the_age_of_the_records_credited_the_quickest_since_the_last_take():
    from clasp.core.credit import CreditCycle

    c = CreditCycle()
    c.admitted(0.0, 1024)
    c.admitted(0.010, 1024)
    assert c.credited(0.030, 1000) == 0.030  # the oldest first
    assert c.credited(0.040, 524) == 0.030  # the first's last 24 and the second's first 500: read at 10 ms
    assert c.take_quickest() == 0.030
    assert c.take_quickest() == 0.0  # nothing credited since
    assert c.credited(0.060, 524) == pytest.approx(0.050)
    assert c.held == 0
    c.admitted(0.100, 0)  # nothing admitted: nothing held
    assert c.credited(0.2, 5) is None


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), max_size=60))
def test_a_credit_cycle_holds_no_more_than_is_in_flight(steps):
    """Whatever is admitted and credited, and whatever is lost (never credited), the records it holds are
    at most those in flight after each credit, and its ages are never negative."""
    from clasp.core.credit import CreditCycle

    c, inflight, now = CreditCycle(), 0, 0.0
    for admit, n in steps:
        now += 0.001
        if admit:
            c.admitted(now, n)
            inflight += n
        else:
            n = min(n, inflight)
            inflight -= n if n % 3 else n // 2  # some credited, the rest of a third of them lost
            age = c.credited(now, n if n % 3 else n - n // 2, inflight)
            assert c.held <= inflight
            assert age is None or age >= 0
    assert c.held == sum(r for _, r in c.admits)
