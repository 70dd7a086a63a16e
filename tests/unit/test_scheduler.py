"""The planner's decisions without sockets (clasp.core.scheduler): exact outputs for given inputs."""

from __future__ import annotations

import collections
from collections import deque
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

import clasp
from clasp.core import scheduler
from clasp.core.dag import DagSpec
from clasp.core.routing import (
    NUM_KEY_GROUPS,
    ROUTE_KEYED,
    ROUTE_TABLE,
    OperatorPlacement,
    Placement,
    Route,
    key_group,
    table_period,
    weighted_table,
)
from clasp.core.scheduler import WorkerInfo
from clasp.core.tracking import CHUNK_BITS, EPOCH_BITS, EPOCH_SIZE, Tracker


def two_source_spec() -> DagSpec:
    """Source `a` (stateless) and source `b` (stateful, keyed by 1 // v: v = 0 makes its key function fail)."""
    dag = clasp.Dag("two")
    dag.operator("a", lambda v: v)
    dag.operator("b", lambda s, v: (v, None), stateful=True, key=lambda v: 1 // v)
    return dag.to_spec()


def queue_of(*chunks: list) -> deque:
    return deque([[c << CHUNK_BITS, list(records), 0] for c, records in enumerate(chunks)])


# ----------------------------------------------------------------- dispatch
def test_window_room_is_the_window_left_at_most_one_batch():
    assert scheduler.window_room(5000, 0, 2000) == 2000
    assert scheduler.window_room(5000, 4000, 2000) == 1000
    assert scheduler.window_room(5000, 5000, 2000) == 0
    assert scheduler.window_room(5000, 5200, 2000) <= 0  # suspects returned: over the window, no room
    # While records are in flight, nothing leaves until half a batch is free; with none, anything does.
    assert scheduler.window_room(5000, 4200, 2000) == 0
    assert scheduler.window_room(5000, 4000, 2000) == 1000
    assert scheduler.window_room(5000, 0, 2000) == 2000
    assert scheduler.window_room(200, 150, 2000) == 0 and scheduler.window_room(200, 100, 2000) == 100


def test_source_holders_counts_the_workers_of_every_source():
    spec = stateful_spec()  # one source, a
    assert scheduler.source_holders(spec, three_worker_placement()) == 3
    one = Placement({"a": OperatorPlacement({"w2": 1.0}, {"w2": 1}),
                     "b": OperatorPlacement({"w0": 1.0}, {"w0": 1}, ["w0"] * NUM_KEY_GROUPS),
                     "c": OperatorPlacement({"w1": 1.0}, {"w1": 1})}, epoch=0, workers=["w0", "w1", "w2"])
    assert scheduler.source_holders(spec, one) == 1


def test_dispatch_limits_scale_with_the_source_workers_unless_given():
    assert scheduler.dispatch_limits(None, None, 1) == (10_000, 5000)  # the one-worker floor
    assert scheduler.dispatch_limits(None, None, 10) == (100_000, 25_000)  # 10,000 and 2,500 per worker
    assert scheduler.dispatch_limits(None, None, 0) == (10_000, 5000)
    assert scheduler.dispatch_limits(200, None, 10) == (200, 25_000)  # a given value is kept as it is
    assert scheduler.dispatch_limits(None, 50, 10) == (100_000, 50)


def test_the_window_covers_every_worker_the_job_spans_and_the_batch_the_source_workers():
    # A chain over ten workers fed by one: each of the ten needs its own records in flight, while each
    # dispatch still goes to the one source worker.
    assert scheduler.dispatch_limits(None, None, 1, 10) == (100_000, 5000)
    assert scheduler.dispatch_limits(None, None, 3, 3) == (30_000, 7500)
    assert scheduler.dispatch_limits(None, None, 10, 1) == (100_000, 25_000)  # never below the holders' own
    assert scheduler.dispatch_limits(7000, None, 1, 10) == (7000, 5000)




def test_take_moves_through_the_head_chunk_then_drops_it():
    q = queue_of([10, 11, 12], [20])
    assert scheduler.take(q, 2) == (0, [10, 11])
    assert q[0][2] == 2 and len(q) == 2
    assert scheduler.take(q, 5) == (2, [12])  # never past the head chunk's end
    assert len(q) == 1
    assert scheduler.take(q, 5) == (1 << CHUNK_BITS, [20])
    assert not q


def test_stateless_source_gets_consecutive_runs_per_table_slot():
    spec = two_source_spec()
    route = Route(ROUTE_TABLE, 0, table=["w0", "w1"])
    d = scheduler.route_records(spec, [route], 100, list(range(6)))
    # 6 records over a table of 2: blocks of 3; block k goes to slot (first + 3k) // 3 % 2.
    assert d.runs == {"w1": [[0, 100, [0, 1, 2]]], "w0": [[0, 103, [3, 4, 5]]]}
    assert d.data == {} and d.failed == [] and (d.first, d.count) == (100, 6)
    assert d.counts == {0: {0: 6}}  # epoch 0 (rids 0..511): six requests of operator 0


def test_keyed_source_goes_to_the_key_groups_owner_and_a_failing_key_is_sent_nowhere():
    spec = two_source_spec()
    owners = ["w0"] * 64 + ["w1"] * 64
    routes = [Route(ROUTE_TABLE, 0, table=["w2"]), Route(ROUTE_KEYED, 1, owners=owners)]
    d = scheduler.route_records(spec, routes, 0, [0, 1, 2])
    assert d.runs == {"w2": [[0, 0, [0, 1, 2]]]}  # a table of one slot: one run
    expected: dict[str, list] = {}
    for rid, v in ((1, 1), (2, 2)):
        key = 1 // v
        expected.setdefault(owners[key_group(key, NUM_KEY_GROUPS)], []).append((1, v, key, rid))
    assert d.data == expected
    assert d.failed == [0]
    assert d.counts == {0: {0: 3, 1: 2}}  # record 0 went to `a` only: `b` has two requests outstanding
    assert d.errors == [{"worker": "planner", "operator": "b", "error": "key function failed: "
                         "ZeroDivisionError('integer division or modulo by zero')", "value": "0"}]


def test_counts_are_per_epoch_for_a_dispatch_across_an_epoch_boundary_less_the_failed_keys():
    spec = two_source_spec()
    n = EPOCH_SIZE + 10
    values = [0 if i in (EPOCH_SIZE - 3, EPOCH_SIZE + 2) else i + 1 for i in range(n)]
    q = deque([[0, values, EPOCH_SIZE - 5]])  # chunk 0, all but its first epoch's last five dispatched
    routes = [Route(ROUTE_TABLE, 0, table=["w0", "w1"]), Route(ROUTE_KEYED, 1, owners=["w0"] * NUM_KEY_GROUPS)]
    d = scheduler.dispatch(q, spec, routes, 15)
    assert (d.first, d.count) == (EPOCH_SIZE - 5, 15)
    assert d.failed == [EPOCH_SIZE - 3, EPOCH_SIZE + 2]
    assert d.counts == {0: {0: 5, 1: 4}, 1: {0: 10, 1: 9}}
    assert sorted(r[3] for r in d.data["w0"]) == [r for r in range(EPOCH_SIZE - 5, EPOCH_SIZE + 10)
                                                  if r not in d.failed]


def test_dispatch_with_no_room_or_no_records_decides_nothing():
    spec = two_source_spec()
    route = [Route(ROUTE_TABLE, 0, table=["w0"])]
    assert scheduler.dispatch(queue_of([1, 2]), spec, route, 0) is None
    assert scheduler.dispatch(deque(), spec, route, 100) is None


@settings(max_examples=150, deadline=None)
@given(chunks=st.lists(st.integers(1, 60), min_size=1, max_size=6),
       rooms=st.lists(st.integers(-3, 50), min_size=1, max_size=8),
       table=st.lists(st.sampled_from(["w0", "w1", "w2"]), min_size=1, max_size=7))
def test_dispatch_never_exceeds_the_room_and_sends_every_record_once_in_order(chunks, rooms, table):
    spec = two_source_spec()
    records = [[f"c{c}r{i}" for i in range(n)] for c, n in enumerate(chunks)]
    q = queue_of(*records)
    expected = [(c << CHUNK_BITS) + i for c, n in enumerate(chunks) for i in range(n)]
    value = {(c << CHUNK_BITS) + i: v for c, rs in enumerate(records) for i, v in enumerate(rs)}
    seen = []
    steps = 0
    while q:
        room = rooms[steps % len(rooms)]
        steps += 1
        if steps > 10_000:
            break
        d = scheduler.dispatch(q, spec, [Route(ROUTE_TABLE, 0, table=table)], room)
        if room <= 0:
            assert d is None
            if all(r <= 0 for r in rooms):
                break
            continue
        assert 0 < d.count <= room
        rids = sorted(first + i for runs in d.runs.values() for _, first, vals in runs for i in range(len(vals)))
        assert rids == list(range(d.first, d.first + d.count))
        for runs in d.runs.values():
            for op, first, vals in runs:
                assert op == 0
                assert vals == [value[first + i] for i in range(len(vals))]
        per_epoch = collections.Counter(rid >> EPOCH_BITS for rid in rids)
        assert d.counts == {e: {0: k} for e, k in per_epoch.items()}
        seen += rids
    if any(r > 0 for r in rooms):
        assert seen == expected and not q


# ----------------------------------------------------------------- recovery
def stateful_spec() -> DagSpec:
    dag = clasp.Dag("rec")
    a = dag.operator("a", lambda v: v)
    b = dag.operator("b", lambda s, v: (v, None), stateful=True, key=lambda v: v)
    c = dag.operator("c", lambda v: None)
    a >> b >> c
    return dag.to_spec()


def three_worker_placement() -> Placement:
    groups = ["w0"] * 64 + ["w1"] * 32 + ["w2"] * 32
    return Placement({
        "a": OperatorPlacement({"w0": 0.5, "w1": 0.25, "w2": 0.25}, {"w0": 2, "w1": 1, "w2": 3}),
        "b": OperatorPlacement({"w0": 0.5, "w1": 0.25, "w2": 0.25}, {"w0": 1, "w1": 1, "w2": 1}, groups),
        "c": OperatorPlacement({"w1": 1.0}, {"w1": 4}),  # only on the worker that dies
    }, epoch=3, workers=["w0", "w1", "w2"])


def test_recovery_re_places_the_dead_workers_share_on_the_survivors():
    spec = stateful_spec()
    old = three_worker_placement()
    q = deque([[2 << CHUNK_BITS, list(range(10)), 4]])  # chunk 2, four of its records dispatched
    r = scheduler.plan_recovery(spec, old, None, "w1", ["w0", "w2"], q, 3, t=12.34567)
    new = r.placement
    assert new.epoch == 4 and new.workers == ["w0", "w1", "w2"]
    assert new.operators["a"] == OperatorPlacement({"w0": 2 / 3, "w2": 1 / 3}, {"w0": 2, "w2": 3})
    # 128 groups by 2/3 : 1/3 is 85 : 43; the survivors keep theirs, w1's 32 go 21 to w0 and 11 to w2.
    assert new.operators["b"].key_groups == ["w0"] * 85 + ["w2"] * 43
    assert new.operators["b"].shares == {"w0": 2 / 3, "w2": 1 / 3}
    # c lived on the dead worker only: it goes whole to the first active survivor, with one instance.
    assert new.operators["c"] == OperatorPlacement({"w0": 1.0}, {"w0": 1})
    new.check(spec)
    assert r.fence == (2 << CHUNK_BITS) + 4
    assert r.lost_groups == 32
    assert r.reason == "worker w1 died: its 32 key groups restart empty (their state is lost)"
    assert r.decision == {"t": 12.346, "trigger": "worker w1 died", "reason": r.reason, "change": True}


def test_recovery_counts_lost_groups_in_the_settled_placement_and_fences_at_the_next_chunk():
    spec = stateful_spec()
    old = three_worker_placement()
    settled = Placement({**old.operators, "b": OperatorPlacement({"w0": 0.5, "w1": 0.5}, {"w0": 1, "w1": 1},
                                                                   ["w0"] * 28 + ["w1"] * 100)}, 2, old.workers)
    r = scheduler.plan_recovery(spec, old, settled, "w1", ["w0", "w2"], deque(), 7)
    assert r.lost_groups == 100
    assert r.fence == 7 << CHUNK_BITS  # nothing queued: everything admitted so far is dispatched


# ----------------------------------------------------------------- the lost-record sweep
def test_sweep_loses_the_suspects_after_two_clean_checks_with_the_same_count():
    step = scheduler.sweep_step
    assert step(None, 0, False, True) == (None, False)  # nothing suspected
    assert step(None, 5, False, True) == ((5, 1), False)  # first clean check
    assert step((5, 1), 4, False, True) == ((4, 1), False)  # a suspect completed since: start over
    assert step((4, 1), 4, True, True) == (None, False)  # migrating: no decision
    assert step((4, 1), 4, False, False) == (None, False)  # a survivor still holds some
    assert step((4, 1), 4, False, True) == (None, True)  # second clean check, same count: lost


def test_lost_error_names_the_dead_workers():
    assert scheduler.lost_error(7, {"w2", "w1"}) == {
        "worker": "w1,w2", "operator": "", "value": "",
        "error": "7 records lost with dead worker(s) w1,w2: they had requests or state there; "
                 "their key groups restarted empty"}


# ----------------------------------------------------------------- idle, and serving again
def test_a_job_is_idle_only_with_nothing_outstanding_and_nothing_under_way():
    C = scheduler.JobCondition
    assert scheduler.busy(C()) is None and scheduler.unsettled(C()) is None
    assert scheduler.busy(C(outstanding=5, queued=2)) == "still has 5 records in flight (2 queued at the planner)"
    for c, why in ((C(suspected=("w2",)), "may have lost worker(s) w2: the connection dropped"),
                   (C(recovering=("w3", "w1")), "is recovering from the death of worker(s) w1, w3"),
                   (C(rolling_back=True), "is rolling back to its last complete checkpoint"),
                   (C(orphaned=True), "lost every worker and waits for one to recover on"),
                   (C(replaying=40), "is replaying 40 records a rollback reopened")):
        assert scheduler.busy(c) == scheduler.unsettled(c) == why  # state() waits for these too
    # wait_idle waits for these; the state is whole already, so state() does not
    for c, why in ((C(rejoining=("w1",)), "is deploying on restarted worker(s) w1"),
                   (C(migrating=True), "is migrating")):
        assert scheduler.busy(c) == why and scheduler.unsettled(c) is None


def test_a_worker_is_suspected_from_its_connection_dropping_until_heard_from_again():
    dropped = {"w1": 10.0, "w2": 10.0, "w9": 10.0}
    heard = {"w0": 9.0, "w1": 9.5, "w2": 10.5}  # w2 sent a heartbeat since: alive; w9 serves no more
    assert scheduler.suspected(["w0", "w1", "w2"], dropped, heard) == ("w1",)


def test_a_refused_restart_is_expected_back_for_a_while():
    refused = {"w1": 100.0, "w2": 100.0 - scheduler.REJOIN_WAIT, "w7": 100.0}
    assert scheduler.expected_rejoins(["w0", "w1", "w2"], refused, 100.0 + 1.0) == ("w1",)


# ----------------------------------------------------------------- job statistics
@dataclass
class FakeJob:
    spec: DagSpec
    placement: Placement
    id: int = 4
    tracker: Tracker = field(default_factory=Tracker)
    workers: list = field(default_factory=lambda: ["w0", "w1", "w2"])
    queued: int = 3
    queued_bytes: int = 300
    counters: dict = field(default_factory=lambda: {"pushed": 10, "dispatched": 7, "source_errors": 1})
    last: dict = field(default_factory=lambda: {"input_rate": 5.0, "throughput": 4.0, "p50": 0.1})
    errors: list = field(default_factory=list)
    autoscale: bool = True
    estimate: dict = field(default_factory=lambda: {"alpha": 2.0})
    decisions: list = field(default_factory=list)
    migrations: list = field(default_factory=list)
    lost_workers: set = field(default_factory=lambda: {"w2"})
    series: list = field(default_factory=lambda: list(range(200)))
    window: int = 6000
    batch: int = 2000
    inflight: int = 4


def op_sample(rate, tau, processed, errors=0, queue=0):
    return {"rate": rate, "tau_us": tau, "processed": processed, "errors": errors, "queue": queue}


def workers_with_samples() -> dict[str, WorkerInfo]:
    w0 = WorkerInfo("w0", "h", "d0", "s0", "m0", 10, 1, 0.0, 0.0, sample={"delta": 2, "cpu_us": 9.0, "jobs": {4: {
        "queue": 1, "failed": 2, "operators": {"a": op_sample(100.0, 10.0, 50, 1, 1)},
        "edges": [{"src": "a", "dst": "b", "rate": 30.0}]}}})
    w1 = WorkerInfo("w1", "h", "d1", "s1", "m1", 10, 2, 0.0, 0.0, sample={"jobs": {4: {
        "failed": 1, "operators": {"a": op_sample(300.0, 20.0, 150), "b": op_sample(10.0, 5.0, 8, 0, 4)},
        "edges": [{"src": "a", "dst": "b", "rate": 12.0}]}}})
    return {"w0": w0, "w1": w1}  # w2 is gone from the registry


def test_job_stats_aggregates_the_workers_samples():
    spec = stateful_spec()
    job = FakeJob(spec, three_worker_placement())
    s = scheduler.job_stats(job, workers_with_samples(), 2)
    assert s["operators"] == {"a": {"rate": 400.0, "tau_us": 17.5, "processed": 200, "errors": 1, "queue": 1},
                              "b": {"rate": 10.0, "tau_us": 5.0, "processed": 8, "errors": 0, "queue": 4},
                              "c": {"rate": 0.0, "tau_us": 0.0, "processed": 0, "errors": 0, "queue": 0}}
    assert s["edges"] == [{"src": "a", "dst": "b", "rate": 42.0}]
    assert s["in_flight"] == {"records": 4, "window": 6000, "dispatch_batch": 2000}
    assert s["failed"] == 2 + 1 + 1  # the workers' failures and the planner's source errors
    assert s["workers"]["w0"] == {"alive": True, "queue": 1, "r_local": 0.0, "r_remote": 0.0, "delta": 2,
                                  "exec_us": 0.0, "cpu_us": 9.0, "queue_delay": 0.0,
                                  "operators": {"a": op_sample(100.0, 10.0, 50, 1, 1)}, "metrics": "m0"}
    assert s["workers"]["w2"] == {"alive": False, "queue": 0, "r_local": 0.0, "r_remote": 0.0, "delta": 0,
                                  "exec_us": 0.0, "cpu_us": None, "queue_delay": 0.0, "operators": {},
                                  "metrics": None}
    assert (s["job"], s["name"], s["input_rate"], s["throughput"]) == (4, "rec", 5.0, 4.0)
    assert s["latency"]["last"] == {"p50": 0.1, "p95": None, "p99": None}
    assert (s["pushed"], s["queued"], s["lost"], s["suspected_lost"]) == (10, 3, 0, 0)
    assert s["active_workers"] == ["w0", "w1", "w2"] and s["workers_active"] == 3 and s["epoch"] == 3
    assert s["lost_workers"] == ["w2"] and s["workers_alive"] == 2 and s["model"] == {"alpha": 2.0}
    assert s["series"] == list(range(80, 200))


def test_job_stats_with_exact_counters_takes_counts_from_them():
    spec = stateful_spec()
    job = FakeJob(spec, three_worker_placement())
    ops = lambda a, b: {"a": {"processed": a, "errors": 1, "queue": 0, "exec_s": a * 1e-5},  # noqa: E731
                        "b": {"processed": b, "errors": 0, "queue": 2, "exec_s": 0.0}}
    counters = {"w0": {"failed": 5, "local": 1, "remote": 2, "operators": ops(60, 0)},
                "w1": {"failed": 0, "local": 3, "remote": 4, "operators": ops(140, 9)}}
    s = scheduler.job_stats(job, workers_with_samples(), 2, counters)
    assert s["operators"]["a"] == {"rate": 400.0, "tau_us": 17.5, "processed": 200, "errors": 2, "queue": 0,
                                   "exec_s": 200e-5, "tau_us_mean": 10.0}
    assert s["operators"]["b"]["processed"] == 9 and s["operators"]["b"]["tau_us_mean"] == 0.0
    assert s["failed"] == 5 + 1
    assert s["workers"]["w1"]["counters"] is counters["w1"]


# ----------------------------------------------------------------- migration records
def test_migration_record_sums_the_replies_and_names_the_failures():
    old = three_worker_placement()
    new = Placement({n: OperatorPlacement({"w0": 1.0}, {"w0": 1}, ["w0"] * 128 if n == "b" else None)
                     for n in "abc"}, 4, old.workers)
    replies = [{"worker": "w0", "pause": 0.01, "hold": 0.05, "group_hold": 0.03, "bytes": 100, "objects": 3, "rows": 7,
                "markers_ms": 1.234, "busy_ms": 2.0, "pause_cpu_ms": 4.0, "packed_groups": 2},
               {"worker": "w2", "pause": 0.02, "hold": 0.04, "group_hold": 0.0, "bytes": 50, "objects": 1, "rows": 0},
               TimeoutError("worker w1 did not answer")]
    r = scheduler.migration_record(old, new, "manual", 1.23456, 0.5, ["w0", "w2", "w1"], replies, 64, ["w9"])
    assert r == {"epoch": 4, "reason": "manual", "t": 1.235, "from_workers": 3, "to_workers": 1,
                 "active": ["w0"], "duration_s": 0.5, "max_pause_s": 0.02, "max_hold_s": 0.05,
                 "max_group_hold_s": 0.03, "max_pause_cpu_s": 0.004, "pauses": {"w0": 0.01, "w2": 0.02},
                 "phases_ms": {"w0": {"markers_ms": 1.23, "busy_ms": 2.0, "pause_cpu_ms": 4.0}, "w2": {}},
                 "bytes": 150, "objects": 4, "rows": 7, "key_groups_moved": 64, "key_groups_packed": 2, "dead": ["w9"],
                 "failed": {"w1": "worker w1 did not answer"}}


@given(st.lists(st.integers(1, 12), min_size=1, max_size=4))
def test_a_table_period_repeated_is_the_table(weights):
    shares = {f"w{i}": w / sum(weights) for i, w in enumerate(weights)}
    table = weighted_table(shares)
    period = table_period(table)
    assert period * (len(table) // len(period)) == table
    assert len(table) % len(period) == 0
    if len(set(weights)) == 1:  # equal shares: one slot each
        assert sorted(period) == sorted(shares)
