"""Epoch progress (clasp.core.tracking) against an adversary, without processes.

A pure simulation runs a random DAG over several workers: each worker keeps its own progress counts until it
flushes them into a report, requests travel between workers, and hypothesis chooses every interleaving (which
worker runs what, when it flushes, which report or request is delivered next; one worker's reports arrive in
order), with planner key-function failures, rescales, worker deaths and rollbacks. At every step an epoch is
complete in the tracker exactly when every request of it is done and every report about them delivered.
Then two real JobEngines, Word Count split over them, feed the same tracker in an adversarial order.
"""

from __future__ import annotations

import collections
import math
import random
from collections import deque

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clasp.apps import wc
from clasp.core import protocol, scheduler
from clasp.core.checkpoint import boundary_reached
from clasp.core.routing import build_placement, route_to
from clasp.core.tracking import CHUNK_BITS, EPOCH_BITS, EPOCH_SIZE, Tracker
from clasp.runtime.engine import JobEngine

CHUNK_EPOCHS = CHUNK_BITS - EPOCH_BITS  # epoch >> CHUNK_EPOCHS is its chunk
MAX_CHUNKS = 4


class Draw:
    """The adversary's choices: hypothesis's (shrinkable) while it plays, a seeded Random while draining."""

    def __init__(self, data=None, rnd: random.Random | None = None):
        self.data, self.rnd = data, rnd
        self.whole = rnd is not None  # draining: a worker runs a whole queued run at a time

    def int(self, lo: int, hi: int) -> int:
        if self.rnd is not None:
            return self.rnd.randint(lo, hi)
        return self.data.draw(st.integers(lo, hi))

    def pick(self, items: list):
        return items[self.int(0, len(items) - 1)]


def epoch_size(sizes: dict[int, int], e: int) -> int:
    """Records in epoch `e`, given the chunks' sizes: the last epoch of a chunk may be short."""
    return min(EPOCH_SIZE, sizes[e >> CHUNK_EPOCHS] - ((e << EPOCH_BITS) & ((1 << CHUNK_BITS) - 1)))


def nonzero_epochs(counts: dict) -> set[int]:
    return {e for e, d in counts.items() if any(d.values())}


class Sim:
    """The planner's queue, the workers, the network and the truth, driving one Tracker."""

    def __init__(self, draw: Draw, ckpt: bool):
        n = draw.int(1, 5)
        self.n_ops = n
        self.succ = [sorted({draw.int(i + 1, n - 1) for _ in range(draw.int(0, 2))}) if i + 1 < n else []
                     for i in range(n)]
        self.sources = sorted({draw.int(0, n - 1) for _ in range(draw.int(1, 2))})
        self.alive = list(range(draw.int(2, 4)))
        self.queues: dict[int, list] = {w: [] for w in self.alive}  # worker -> [[op, epoch, requests]]
        self.pending: dict[int, dict] = {w: {} for w in self.alive}  # worker -> {epoch: {op: delta}} unflushed
        self.outbox: dict[int, deque] = {w: deque() for w in self.alive}  # reports sent, not delivered
        self.flight: list[tuple] = []  # (from, to, op, epoch, requests); from -1: the planner
        self.queue: deque = deque()  # the planner's: [chunk, next index]
        self.sizes: dict[int, int] = {}
        self.t = Tracker()
        self.now = 0.0
        self.disp: dict[int, int] = {}  # epoch -> records dispatched in this era
        self.tainted: set[int] = set()  # epochs some request or count of which died with a worker
        self.lost: set[int] = set()
        self.ckpt = ckpt

    # ----------------------------------------------------------------- the truth
    def size(self, e: int) -> int:
        return epoch_size(self.sizes, e)

    def busy(self) -> set[int]:
        """Epochs with a record not dispatched, a request queued or travelling, or a count not delivered."""
        out = {e for q in self.queues.values() for _, e, _ in q}
        out |= {m[3] for m in self.flight}
        for c, off in self.queue:
            base = c << CHUNK_BITS
            out |= set(range((base + off) >> EPOCH_BITS, ((base + self.sizes[c] - 1) >> EPOCH_BITS) + 1))
        for p in self.pending.values():
            out |= nonzero_epochs(p)
        for box in self.outbox.values():
            for r in box:
                out |= nonzero_epochs(r)
        return out

    def complete(self) -> set[int]:
        return {e for e in self.disp if e not in self.t.epochs and e not in self.lost}

    def check(self) -> None:
        t, busy = self.t, self.busy()
        done = self.complete()
        for e in done:
            assert self.disp[e] == self.size(e), f"epoch {e} complete with records not dispatched"
            assert e not in busy, f"epoch {e} complete with work of it alive or unreported"
            assert e not in self.tainted, f"epoch {e} complete with work of it dead"
        for e in self.disp:
            if e in t.epochs and e not in self.lost:
                assert (self.disp[e] < self.size(e) or e in busy or e in self.tainted), \
                    f"epoch {e} done and reported, still open"
        assert not self.lost & set(t.epochs)
        assert set(t.epochs) <= set(self.disp)
        assert t.completed == sum(map(self.size, done))
        assert t.lost == sum(map(self.size, self.lost))
        assert t.unknown == 0

    # ----------------------------------------------------------------- the planner
    def admit(self, draw: Draw) -> None:
        n = draw.int(1, 3 * EPOCH_SIZE)
        c = self.t.admit(n, self.now) >> CHUNK_BITS
        self.sizes[c] = n
        self.queue.append([c, 0])

    def fence(self) -> int:
        if self.queue:
            c, off = self.queue[0]
            return (c << CHUNK_BITS) + off
        return self.t.next_chunk << CHUNK_BITS

    def dispatch(self, draw: Draw) -> None:
        """One dispatch: a piece of the head chunk (across epochs), to every source; a record whose key
        function fails for a source is sent nowhere on that route."""
        head = self.queue[0]
        c, off = head
        n = draw.int(1, min(700, self.sizes[c] - off))
        first = (c << CHUNK_BITS) + off
        counts: dict[int, dict[int, int]] = {}
        rid, end = first, first + n
        while rid < end:
            e = rid >> EPOCH_BITS
            k = min(end, (e + 1) << EPOCH_BITS) - rid
            self.disp[e] = self.disp.get(e, 0) + k
            for s in self.sources:
                sent = k - (draw.int(0, k) if draw.int(0, 3) == 0 else 0)
                counts.setdefault(e, {})[s] = sent
                part = draw.int(0, sent)  # over up to two workers
                for m in (part, sent - part):
                    if m:
                        self.flight.append((-1, draw.pick(self.alive), s, e, m))
            rid += k
        head[1] += n
        if head[1] == self.sizes[c]:
            self.queue.popleft()
        self.t.dispatched(first, n, counts, self.now)

    # ----------------------------------------------------------------- the workers and the network
    def run(self, draw: Draw, w: int) -> None:
        """Worker `w` runs some requests of one queued run; each makes 0..3 requests of every successor."""
        q = self.queues[w]
        task = draw.pick(q)
        op, e, n = task
        m = n if draw.whole else draw.int(1, n)
        task[2] -= m
        if not task[2]:
            q.remove(task)
        p = self.pending[w].setdefault(e, {})
        p[op] = p.get(op, 0) - m
        for s in self.succ[op]:
            k = draw.int(0, 3 * m)
            p[s] = p.get(s, 0) + k  # the engine's count may come back to zero: an entry stays
            if k:
                to = draw.pick(self.alive)
                if to == w:
                    q.append([s, e, k])
                else:
                    self.flight.append((w, to, s, e, k))

    def deliver(self, draw: Draw) -> None:
        _, to, op, e, n = self.flight.pop(draw.int(0, len(self.flight) - 1))
        self.queues[to].append([op, e, n])

    def flush(self, w: int) -> None:
        self.outbox[w].append(self.pending[w])
        self.pending[w] = {}

    def report(self, w: int) -> None:
        self.t.progress(self.outbox[w].popleft(), self.now)

    def rescale(self, draw: Draw, w: int) -> None:
        """Requests move to another worker with their key groups: no count changes."""
        task = draw.pick(self.queues[w])
        m = draw.int(1, task[2])
        task[2] -= m
        if not task[2]:
            self.queues[w].remove(task)
        self.flight.append((w, draw.pick([x for x in self.alive if x != w]), task[0], task[1], m))

    def die(self, draw: Draw, w: int) -> None:
        """SIGKILL: the worker's queues and counts vanish, with the reports still in its socket (those on the
        wire arrive) and the requests sent to it; those it sent may or may not arrive."""
        self.alive.remove(w)
        self.tainted |= {e for _, e, _ in self.queues.pop(w)}
        self.tainted |= nonzero_epochs(self.pending.pop(w))
        box = list(self.outbox[w])
        keep = draw.int(0, len(box))
        for r in box[keep:]:
            self.tainted |= nonzero_epochs(r)
        self.outbox[w] = deque(box[:keep])
        kept = []
        for m in self.flight:
            if m[1] == w or (m[0] == w and draw.int(0, 1)):
                self.tainted.add(m[3])
            else:
                kept.append(m)
        self.flight = kept
        if self.ckpt:
            self.rollback(draw)
        else:
            self.t.suspect_below(self.fence())

    def lose(self) -> None:
        """The planner gives up on the suspect epochs still open."""
        t = self.t
        gone = {e for e in t.suspect_epochs if e in t.epochs}
        assert t.lose_suspects() == sum(map(self.size, gone))
        self.lost |= gone
        assert not t.suspect_epochs and not t.suspects

    def rollback(self, draw: Draw) -> None:
        """Recovery to a checkpoint: every request and count of the era is dropped (the workers restore, the
        planner ignores the era's reports) and the chunks from the boundary on are dispatched again."""
        t = self.t
        b = draw.int(0, min(t.chunks) if t.chunks else t.next_chunk)
        assert boundary_reached(t, b)
        assert all(e >> CHUNK_EPOCHS >= b for e in self.tainted)
        reopened = sum(n for c, n in self.sizes.items() if c >= b)
        undone = sum(self.size(e) for e in self.complete() if e >> CHUNK_EPOCHS >= b)
        assert t.rollback(b, {c: (0.0, n) for c, n in self.sizes.items() if c >= b}) == (reopened, undone)
        assert not [e for e in t.open_epochs() if e >> CHUNK_EPOCHS >= b]  # their counts start from zero
        self.tainted.clear()
        self.flight.clear()
        for w in self.alive:
            self.queues[w].clear()
            self.pending[w] = {}
        for w in self.outbox:
            self.outbox[w].clear()
        self.disp = {e: k for e, k in self.disp.items() if e >> CHUNK_EPOCHS < b}
        self.queue = deque([c, 0] for c in sorted(self.sizes) if c >= b)

    # ----------------------------------------------------------------- the adversary
    def moves(self) -> list[str]:
        m = []
        if len(self.sizes) < MAX_CHUNKS:
            m.append("admit")
        if self.queue:
            m.append("dispatch")
        if any(self.queues[w] for w in self.alive):
            m += ["run", "run", "run"] + ["rescale"] * (len(self.alive) > 1)
        if self.flight:
            m += ["deliver", "deliver"]
        if any(self.pending[w] for w in self.alive):
            m.append("flush")
        if any(self.outbox.values()):
            m += ["report", "report"]
        if len(self.alive) > 1 and self.disp:  # a death before any dispatch is no death for the tracker
            m += ["die"] * (1 + 2 * any(self.queues[w] or self.pending[w] for w in self.alive))
        if self.queue or self.flight or any(self.queues.values()) or any(self.outbox.values()):
            m.append("catch_up")
        if self.ckpt and self.t.completed:  # deaths roll back at any time; this one undoes completed epochs
            m.append("rollback")
        elif self.t.suspect_epochs:
            m.append("lose")
        return m

    def step(self, draw: Draw, move: str) -> None:
        self.now += 1.0
        if move in ("admit", "dispatch", "deliver", "rollback"):
            getattr(self, move)(draw)
        elif move == "lose":
            self.lose()
        elif move in ("run", "rescale"):
            getattr(self, move)(draw, draw.pick([w for w in self.alive if self.queues[w]]))
        elif move == "flush":
            self.flush(draw.pick([w for w in self.alive if self.pending[w]]))
        elif move == "report":
            self.report(draw.pick([w for w in self.outbox if self.outbox[w]]))
        elif move == "catch_up":  # a burst: everything so far runs and reports, in a random order, step by step
            self.drain(Draw(rnd=random.Random(draw.int(0, 2**32))))
            return
        elif move == "die":  # the worker holding most (they are alike but for what they hold)
            self.die(draw, max(self.alive, key=lambda w: len(self.queues[w]) + len(self.pending[w])))
        self.check()

    def drain(self, draw: Draw) -> None:
        """Everything runs, flushes and arrives, in an order still chosen at random, checked at each step."""
        while True:
            moves = [m for m in self.moves() if m in ("dispatch", "run", "deliver", "flush", "report")]
            if not moves:
                break
            self.step(draw, draw.pick(moves))


@given(st.data())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_an_epoch_completes_exactly_when_its_work_is_done_and_reported(data):
    """With checkpoints off a death makes suspects of what was dispatched, and the planner may give up on
    them at any time; with checkpoints on it rolls back (so may the adversary, once something completed)."""
    ckpt = data.draw(st.booleans(), label="checkpoints")
    adversary = Draw(data)
    sim = Sim(adversary, ckpt)
    sim.admit(adversary)
    for _ in range(data.draw(st.integers(0, 80), label="steps")):
        if moves := sim.moves():
            sim.step(adversary, adversary.pick(moves))
    sim.drain(Draw(rnd=random.Random(data.draw(st.integers(0, 2**32), label="seed"))))
    t = sim.t
    # the survivors hold nothing more: what is still open is what died with a worker, all of it suspect
    assert set(t.epochs) == t.suspect_epochs == sim.tainted - sim.lost
    if t.suspect_epochs:
        sim.lose()
        sim.check()
    assert sim.tainted <= sim.lost
    assert not t.epochs and not t.chunks and not t.suspect_epochs
    assert t.completed + t.lost == t.admitted == sum(sim.sizes.values()) and t.outstanding == 0
    if ckpt:
        assert t.lost == 0 and t.completed == t.admitted
    # late reports for lost epochs change nothing
    for e in sorted(sim.lost):
        before = (t.completed, t.lost, t.unknown)
        assert t.progress({e: {0: -1, sim.n_ops - 1: 2}}, sim.now) == 0
        assert (t.completed, t.lost, t.unknown) == before and not t.epochs


def test_a_consumers_report_before_its_producers_leaves_the_epoch_open():
    """The case the per-operator counts are for: summed over operators this epoch would be at zero."""
    t = Tracker()
    rid = t.admit(1, now=0.0)
    t.dispatched(rid, 1, {0: {0: 1}}, now=0.0)
    # w0 ran the source request (-1 at 0) making one request of operator 1 (+1), on w1; w1 ran it (-1 at 1).
    assert t.progress({0: {1: -1}}, now=1.0) == 0  # w1's report first
    assert t.open_epochs() == {0: {0: 1, 1: -1}}
    assert t.progress({0: {0: -1, 1: 1}}, now=2.0) == 1
    assert t.outstanding == 0


def test_a_late_report_of_a_lost_epoch_is_ignored_and_the_rest_of_it_is_not_counted_again():
    t = Tracker()
    base = t.admit(EPOCH_SIZE + 10, now=0.0)
    t.dispatched(base, EPOCH_SIZE + 4, {0: {0: EPOCH_SIZE}, 1: {0: 4}}, now=0.0)
    assert t.progress({0: {0: -EPOCH_SIZE}}, now=1.0) == EPOCH_SIZE
    assert t.suspect_below(base + EPOCH_SIZE + 4) == 4  # epoch 1: 4 of its 10 records dispatched
    t.dispatched(base + EPOCH_SIZE + 4, 6, {1: {0: 6}}, now=2.0)  # dispatching goes on after the death
    assert t.lose_suspects() == 10 and t.lost == 10 and t.outstanding == 0
    assert t.progress({1: {0: -10}}, now=3.0) == 0 and t.unknown == 0 and t.completed == EPOCH_SIZE


# ----------------------------------------------------------------- two real engines
WORDS = [f"w{i}" for i in range(40)]


def line(rnd: random.Random) -> str:
    return " ".join(rnd.choice(WORDS) + rnd.choice(["", ".", ","]) for _ in range(rnd.randint(0, 6)))


def rids_of(kind: str, body: list) -> set[int]:
    if kind == "runs":
        return {first + i for _, first, values in body for i in range(len(values))}
    return {r[3] for r in protocol.expand_columns(body)}


@given(st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_two_engines_counts_complete_each_epoch_exactly_and_the_state_is_exact(data):
    """Word Count over two JobEngines: the planner's dispatch (scheduler.dispatch) sends runs, the engines'
    remote batches travel as cols frames, and their progress reports reach the tracker in an order the
    adversary chooses. An epoch is complete exactly when nothing of it is queued, travelling or unreported."""
    spec = wc.build_dag().to_spec()
    placement = build_placement(spec, ["w0", "w1"], {"split": {0: 1, 1: 1}, "count": {0: 1, 1: 1}}, 10)
    engines = {w: JobEngine(1, spec, w, placement) for w in ("w0", "w1")}
    max_batch = data.draw(st.integers(1, 300), label="max batch")
    for eng in engines.values():
        # Every timed request counts as stalled and no round is cut by the clock: the rounds, so the
        # interleavings hypothesis replays, do not depend on the clock (a loaded host cut them at other
        # places on a replay). A small batch cap ends rounds early: finer interleavings.
        eng.executor.stall = 0.0
        eng.executor.round_wall = math.inf
        eng.outbox.max_batch = max_batch
    routes = [route_to(spec, placement, s, None) for s in spec.sources]
    rnd = random.Random(data.draw(st.integers(0, 2**32), label="seed"))
    t = Tracker()
    queue: deque = deque()
    lines, sizes = [], {}
    for n in data.draw(st.lists(st.integers(1, 2 * EPOCH_SIZE + 50), min_size=1, max_size=3), label="chunks"):
        chunk = [line(rnd) for _ in range(n)]
        base = t.admit(n, 0.0)
        sizes[base >> CHUNK_BITS] = n
        queue.append([base, chunk, 0])
        lines += chunk
    flight: list[tuple[str, str, list]] = []  # (to, kind, body)
    outbox: dict[str, deque] = {w: deque() for w in engines}
    disp: collections.Counter = collections.Counter()

    def check():
        busy = {r[3] >> EPOCH_BITS for eng in engines.values() for op in eng.ops for r in op.queue}
        busy |= {r[3] >> EPOCH_BITS for eng in engines.values() for rows in eng.outbox.pending.values() for r in rows}
        busy |= {rid >> EPOCH_BITS for _, kind, body in flight for rid in rids_of(kind, body)}
        busy |= {e for eng in engines.values() for e in nonzero_epochs(eng.executor.progress)}
        busy |= {e for box in outbox.values() for r in box for e in nonzero_epochs(r)}
        for e, k in disp.items():
            done = k == epoch_size(sizes, e) and e not in busy
            assert (e not in t.epochs) == done, f"epoch {e}: complete {e not in t.epochs}, done {done}"
        assert t.completed == sum(epoch_size(sizes, e) for e in disp if e not in t.epochs) and t.unknown == 0

    def move(m: str, w: str | None) -> None:
        eng = engines.get(w)
        if m == "dispatch":
            d = scheduler.dispatch(queue, spec, routes, data.draw(st.integers(1, 600)))
            per_epoch = collections.Counter(rid >> EPOCH_BITS for rid in range(d.first, d.first + d.count))
            assert d.counts == {e: {0: k} for e, k in per_epoch.items()}  # `split`, the one source, fails no key
            disp.update(per_epoch)
            for to, runs in d.runs.items():
                flight.append((to, "runs", runs))
            t.dispatched(d.first, d.count, d.counts, 1.0)
        elif m == "deliver":
            to, kind, body = flight.pop(data.draw(st.integers(0, len(flight) - 1)))
            if kind == "runs":
                engines[to].receive_runs(placement.epoch, body)
            else:
                engines[to].receive_columns(placement.epoch, body)
        elif m == "run":
            eng.run_round()
            for to, (groups, _n) in eng.take_batches().items():
                _, body = protocol.decode(protocol.encode("cols", [1, eng.epoch, groups]))
                flight.append((to, "cols", body[2]))
        elif m == "flush":
            outbox[w].append(eng.take_progress())
        elif m == "report":
            _, body = protocol.decode(protocol.encode("done", [1, outbox[w].popleft(), 0]))
            t.progress(body[1], 2.0)
        check()

    def moves() -> list[tuple[str, str | None]]:
        out = [("dispatch", None)] * bool(queue) + [("deliver", None)] * bool(flight)
        for w, eng in engines.items():
            out += [("run", w)] * (not eng.idle()) + [("flush", w)] * bool(eng.executor.progress)
            out += [("report", w)] * bool(outbox[w])
        return out

    for _ in range(data.draw(st.integers(0, 80), label="steps")):
        if ms := moves():
            move(*ms[data.draw(st.integers(0, len(ms) - 1))])
    while ms := moves():
        move(*rnd.choice(ms))
    assert t.completed == t.admitted == len(lines) and not t.epochs and not t.chunks
    state = [eng.ops[1].state_dict() for eng in engines.values()]
    assert not set(state[0]) & set(state[1])  # every key on its owner only
    assert {**state[0], **state[1]} == wc.expected(lines)
