"""Epoch progress for records read at the workers (clasp.core.tracking: leases, seals), against an adversary.

A pure simulation: workers lease chunk ids, read batches of a source (each batch one chunk), hand the
records to a splitting operator spread over every worker, whose outputs go to a last operator anywhere;
each worker keeps its progress counts until it flushes them, and its seals and reports reach the planner in
order, but hypothesis interleaves the workers' messages, the executions and the flushes, and rolls the job
back to a checkpoint's boundary now and then (every worker's work and unsent reports dropped, as a recovery
does). At every step an epoch is complete in the tracker exactly when its seal arrived, no request of it is
left anywhere and every report about it arrived; at the end every record read since the checkpoint is
complete once, and the credit returned to each reader is what it read.
"""

from __future__ import annotations

from collections import deque

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clasp.core.checkpoint import boundary_reached
from clasp.core.tracking import CHUNK_BITS, EPOCH_BITS, Tracker, add_range

WORKERS = 3
SPLIT, LAST = 1, 2


def fan_out(rid: int) -> int:
    return rid % 3  # a record splits into 0, 1 or 2 outputs


class Sim:
    def __init__(self):
        self.t = Tracker()
        self.queues = [deque() for _ in range(WORKERS)]  # (op, rid)
        self.progress: list[dict] = [{} for _ in range(WORKERS)]
        self.outbox = [deque() for _ in range(WORKERS)]
        self.leases: list[list[int]] = [[] for _ in range(WORKERS)]
        self.floor = 0  # leases below it were dropped at a barrier
        self.sealed: dict[int, int] = {}  # chunk -> size, seals sent this era
        self.delivered: set[int] = set()
        self.read_by = [0] * WORKERS  # records read per worker whose credit has not come back
        self.checkpoint = 0  # the boundary of the last checkpoint (every chunk below complete)
        self.credit = [0] * WORKERS
        self.queued: dict[int, int] = {}  # epoch -> requests queued anywhere

    def count(self, w: int, rid: int, op: int, k: int) -> None:
        d = self.progress[w].setdefault(rid >> EPOCH_BITS, {})
        d[op] = d.get(op, 0) + k

    def read(self, w: int, n: int, dests: list[int]) -> None:
        lease = [c for c in self.leases[w] if c >= self.floor]
        if not lease:
            first = self.t.lease(2)
            lease = [first, first + 1]
        chunk = lease.pop(0)
        self.leases[w] = lease
        first = chunk << CHUNK_BITS
        counts: dict = {}
        add_range(counts, SPLIT, first, n)
        for i in range(n):
            self.queues[dests[i % len(dests)]].append((SPLIT, first + i))
            e = (first + i) >> EPOCH_BITS
            self.queued[e] = self.queued.get(e, 0) + 1
        self.outbox[w].append(("seal", chunk, n, counts))
        self.sealed[chunk] = n
        self.read_by[w] += n

    def run(self, w: int, dest: int, many: int = 1) -> None:
        for _ in range(min(many, len(self.queues[w]))):
            op, rid = self.queues[w].popleft()
            e = rid >> EPOCH_BITS
            self.queued[e] -= 1
            self.count(w, rid, op, -1)
            if op == SPLIT:
                k = fan_out(rid)
                for _ in range(k):
                    self.queues[dest].append((LAST, rid))
                if k:
                    self.queued[e] += k
                    self.count(w, rid, LAST, k)

    def flush(self, w: int) -> None:
        if self.progress[w]:
            self.outbox[w].append(("done", self.progress[w]))
            self.progress[w] = {}

    def deliver(self, w: int) -> None:
        msg = self.outbox[w].popleft()
        if msg[0] == "seal":
            self.t.sealed(msg[1], msg[2], msg[3], 0.0, reader=str(w))
            self.delivered.add(msg[1])
        else:
            self.t.progress(msg[1], 0.0)
        for r, n in self.t.take_credit().items():
            self.credit[int(r)] += n

    def barrier(self) -> None:
        """A checkpoint's barrier: the boundary is the next chunk not leased; leases below it are dropped."""
        self.floor = self.t.next_chunk

    def take_checkpoint(self) -> None:
        # Every worker answered the barrier, after the seals it sent before it (one ordered channel).
        answered = all(c in self.delivered for c in self.sealed if c < self.floor)
        if answered and boundary_reached(self.t, self.floor):
            self.checkpoint = self.floor
            self.t.forget_sources_below(self.checkpoint)

    def roll_back(self) -> None:
        for w in range(WORKERS):
            self.queues[w].clear()
            self.queued = {}
            self.outbox[w].clear()
            self.progress[w] = {}
            self.leases[w] = []
        self.t.rollback(self.checkpoint, {})
        self.sealed = {c: n for c, n in self.sealed.items() if c < self.checkpoint}
        self.delivered = {c for c in self.delivered if c < self.checkpoint}

    def truly_done(self, e: int) -> bool:
        c = (e << EPOCH_BITS) >> CHUNK_BITS
        if c not in self.delivered:
            return False
        if self.queued.get(e):
            return False
        if any(p.get(e) for p in self.progress):
            return False
        for box in self.outbox:
            for m in box:
                if m[0] == "done" and e in m[1]:
                    return False
        return True

    def check(self) -> None:
        for c, n in self.sealed.items():
            if c < self.checkpoint:
                continue
            first = c << CHUNK_BITS
            for e in range(first >> EPOCH_BITS, ((first + n - 1) >> EPOCH_BITS) + 1):
                complete = c in self.t.source_sizes and e not in self.t.epochs
                assert complete == self.truly_done(e), (c, e, complete)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_source_epoch_completes_exactly_when_its_work_is_done_and_reported(data):
    s = Sim()
    for _ in range(data.draw(st.integers(5, 80))):
        w = data.draw(st.integers(0, WORKERS - 1))
        action = data.draw(st.sampled_from(["read", "run", "run", "flush", "deliver", "deliver", "barrier",
                                            "checkpoint", "rollback"]))
        if action == "read":
            n = data.draw(st.integers(1, 1200))
            dests = data.draw(st.lists(st.integers(0, WORKERS - 1), min_size=1, max_size=3))
            s.read(w, n, dests)
        elif action == "run" and s.queues[w]:
            s.run(w, data.draw(st.integers(0, WORKERS - 1)), data.draw(st.sampled_from([1, 7, 600])))
        elif action == "flush":
            s.flush(w)
        elif action == "deliver" and s.outbox[w]:
            s.deliver(w)
        elif action == "barrier":
            s.barrier()
        elif action == "checkpoint":
            s.take_checkpoint()
        elif action == "rollback":
            s.roll_back()
        s.check()
    # drain: everything runs, is flushed and delivered
    while any(s.queues) or any(s.outbox) or any(s.progress):
        for w in range(WORKERS):
            while s.queues[w]:
                s.run(w, (w + 1) % WORKERS, 1000)
            s.flush(w)
            while s.outbox[w]:
                s.deliver(w)
        s.check()
    t = s.t
    assert t.outstanding == 0 and not t.epochs and t.unknown == 0
    assert t.completed == t.admitted == t.read == t.read_done
    assert t.read == sum(s.sealed.values())


def test_a_report_that_overtakes_the_seal_keeps_the_epoch_open_until_the_seal():
    t = Tracker()
    c = t.lease(4)
    first = c << CHUNK_BITS
    t.progress({first >> EPOCH_BITS: {1: -10}}, 1.0)  # the consumer's report first
    assert t.open_epochs() and t.completed == 0 and t.outstanding == 0
    assert not boundary_reached(t, c + 1) or c not in t.chunks  # unsealed: not admitted yet
    counts: dict = {}
    add_range(counts, 1, first, 10)
    assert t.sealed(c, 10, counts, 2.0, reader="w1") == 10
    assert t.completed == 10 and not t.open_epochs() and t.take_credit() == {"w1": 10}
    assert t.sealed(c, 10, counts, 3.0) == 0  # a second seal of the chunk is ignored


def test_seals_and_reports_outside_every_lease_are_ignored():
    t = Tracker()
    assert t.sealed(5, 10, {}, 0.0) == 0 and t.admitted == 0
    t.progress({(5 << CHUNK_BITS) >> EPOCH_BITS: {1: -1}}, 0.0)
    assert not t.open_epochs()
    c = t.lease(1)
    t.rollback(0, {})  # the lease is void after a rollback
    assert t.sealed(c, 3, {}, 0.0) == 0 and not t.open_epochs()


def test_rollback_forgets_source_chunks_above_the_boundary_and_keeps_those_below():
    t = Tracker()
    a = t.lease(2)
    t.sealed(a, 100, {}, 0.0)  # no successor: complete at once
    boundary = t.next_chunk
    b = t.lease(1)
    t.sealed(b, 50, {(b << CHUNK_BITS) >> EPOCH_BITS: {1: 50}}, 0.0)
    t.sealed(a + 1, 7, {}, 0.0)  # a chunk below the boundary, complete
    assert t.completed == 107 and t.admitted == 157
    t.forget_sources_below(boundary)
    reopened, uncompleted = t.rollback(boundary, {})
    assert (reopened, uncompleted) == (0, 0)
    assert t.admitted == t.completed == 107 and t.read == 107 and not t.open_epochs()
    c = t.lease(1)
    assert c > b and t.sealed(c, 5, {}, 0.0) == 5
