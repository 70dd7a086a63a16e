"""A job's admission, dispatch and progress as transitions of its phase machine (clasp.core.job_machine):
events in, instructions out, on the planner's own job record and checkpointer, with no process."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clasp
from clasp.core.credit import QueueBound
from clasp.core.job_machine import (
    CLIENT_IDLE,
    Ack,
    ChunkBegins,
    DispatchReady,
    JobMachine,
    LoadChunk,
    LogChunk,
    LogWritten,
    MaybeIdle,
    Moved,
    Progress,
    Push,
    Refuse,
    SendCredit,
    Tick,
)
from clasp.core.lifecycle import (
    Barrier,
    BarrierSent,
    DropInput,
    FailRequests,
    Forget,
    InvalidTransition,
    JobLife,
    Migrate,
    Migrated,
    NoWorkerLeft,
    Phase,
    ResumeDispatch,
    Retire,
    RollBack,
    RolledBack,
    StartRollback,
    StopWorkers,
    WorkerDied,
    WorkerJoined,
)
from clasp.core.routing import route_to, spread_placement
from clasp.core.scheduler import Dispatch
from clasp.core.tracking import CHUNK_BITS, EPOCH_BITS, Tracker
from clasp.runtime.planner_job import CheckpointState, PlannerJob
from clasp.runtime.state_store import FileStore

DISPATCHING = {Phase.RUNNING, Phase.MIGRATING, Phase.ORPHANED}


def new_job(tmp_path=None, phase: Phase = Phase.RUNNING, bound: QueueBound | None = None,
            window: int = 5000, batch: int = 2000) -> PlannerJob:
    """A job of one stateless source `a` on two workers; with `tmp_path`, checkpoints on (its input log there)."""
    dag = clasp.Dag("m")
    dag.operator("a", lambda v: v)
    spec = dag.to_spec()
    placement = spread_placement(spec, ["w0", "w1"], 4)
    job = PlannerJob(1, spec, placement, Tracker(), ["w0", "w1"])
    if tmp_path is not None:
        job.ckpt = CheckpointState(FileStore(tmp_path), 1, 10_000)
    job.machine = JobMachine(job, bound or QueueBound(), JobLife(tmp_path is not None, phase))
    job.routes = [route_to(spec, placement, s, None) for s in spec.sources]
    job.window, job.batch = window, batch
    return job


def feed(job: PlannerJob, event) -> list:
    """The shell's part that touches no socket: the input log's writes and reads."""
    out = list(job.machine.handle(event))
    for step in out:
        if isinstance(step, LogChunk):
            job.ckpt.log.append(step.chunk, step.t, step.records, step.nbytes, step.frame)
    return out


def push(job: PlannerJob, n: int, req: int = 1, client: bytes = b"c", now: float = 0.0) -> list:
    return feed(job, Push(client, req, list(range(n)), b"x" * (8 * n), now, 8 * n))


def dispatched(out: list) -> list[Dispatch]:
    return [s for s in out if isinstance(s, Dispatch)]


def finish(d: Dispatch) -> dict:
    """The report of a worker that finished every request of `d` (a source with no successor)."""
    return {e: {op: -k for op, k in c.items()} for e, c in d.counts.items()}


def drain(job: PlannerJob, now: float = 1.0) -> list[Dispatch]:
    """Dispatch until the queue is empty or held, reporting each step complete."""
    out = []
    while True:
        ds = dispatched(feed(job, DispatchReady(now)))
        if not ds:
            return out
        out += ds
        for d in ds:
            feed(job, Progress(b"w0", finish(d), now))


# ----------------------------------------------------------------- admission
def test_a_push_is_admitted_queued_and_acknowledged_with_credit():
    job = new_job()
    out = push(job, 100)
    assert out[0] == ResumeDispatch()
    (ack,) = out[1:]
    assert isinstance(ack, Ack) and (ack.client, ack.req, ack.accepted) == (b"c", 1, 100)
    assert ack.credit == QueueBound().max_bytes - job.queued_bytes > 0
    assert job.queued == 100 and job.tracker.admitted == 100 and job.counters["pushed"] == 100


def test_a_push_is_refused_when_the_job_takes_no_input():
    job = new_job()
    job.input_ended = True
    (r,) = push(job, 5)
    assert isinstance(r, Refuse) and "end_input" in r.reason and job.queued == 0
    job = new_job()
    job.machine.handle(Retire())
    (r,) = push(job, 5)
    assert isinstance(r, Refuse) and "cancelled" in r.reason and job.tracker.admitted == 0


def test_over_its_bound_a_job_defers_the_ack_until_dispatch_drains_it():
    job = new_job(bound=QueueBound(max_records=1000), window=600, batch=600)
    assert any(isinstance(s, Ack) for s in push(job, 900, req=1))
    out = push(job, 900, req=2)  # 1,800 queued: over the bound
    assert not any(isinstance(s, Ack) for s in out) and len(job.deferred_acks) == 1
    out = feed(job, DispatchReady(1.0))  # 600 leave: 1,200 still queued, still over
    assert dispatched(out) and not any(isinstance(s, Ack) for s in out)
    feed(job, Progress(b"w0", finish(dispatched(out)[0]), 1.0))
    out = feed(job, DispatchReady(1.0))
    assert [s.req for s in out if isinstance(s, Ack)] == [2]


def test_a_tick_forgets_idle_clients():
    job = new_job()
    push(job, 10, client=b"a", now=0.0)
    assert job.clients.keys() == {b"a"}
    assert feed(job, Tick(1.0, CLIENT_IDLE + 1)) == [] and not job.clients


def test_a_tick_that_measures_a_faster_drain_releases_the_acks_the_larger_limit_allows():
    bound = QueueBound(max_bytes=64 << 20, max_delay=1.0)
    job = new_job(bound=bound)
    job.limit = bound.limit(None)  # the floor, 8 pushes, before any rate is measured
    out = feed(job, Push(b"a", 7, list(range(10)), b"x" * (bound.floor() + (1 << 20)), 0.0,
                        bound.floor() + (1 << 20)))
    assert not any(isinstance(s, Ack) for s in out)
    job.backlog, job.drained = True, 60 << 20  # a tick with a backlog throughout drained 60 MB
    (ack,) = feed(job, Tick(1.0, 0.5))
    assert isinstance(ack, Ack) and ack.req == 7 and job.limit == 60 << 20


# ----------------------------------------------------------------- dispatch, held by the phase
@pytest.mark.parametrize("hold, release", [(Barrier(), BarrierSent()), (RollBack("worker w1 died"), RolledBack())])
def test_pushes_during_a_barrier_or_a_rollback_queue_up_and_leave_when_it_ends(hold, release):
    job = new_job()
    job.machine.handle(hold)
    assert any(isinstance(s, Ack) for s in push(job, 3000))
    assert feed(job, DispatchReady(1.0)) == [] and job.queued == 3000
    assert job.machine.handle(release) == [ResumeDispatch()]
    out = feed(job, DispatchReady(1.0))
    assert out[0] == ChunkBegins(0) and dispatched(out)[0].count == 2000 and job.queued == 1000


def test_a_migration_keeps_dispatching_and_counting_progress():
    job = new_job()
    job.machine.handle(Migrate())
    push(job, 500)
    (d,) = dispatched(feed(job, DispatchReady(1.0)))
    assert d.count == 500
    assert feed(job, Progress(b"w1", finish(d), 2.0)) == [Moved(), MaybeIdle()]
    assert job.tracker.completed == 500
    assert job.machine.handle(Migrated()) == [ResumeDispatch()]


def test_a_replayed_chunk_on_disk_is_read_in_before_it_leaves():
    job = new_job()
    job.queue.append([0, None, 0])
    assert feed(job, DispatchReady(1.0)) == [LoadChunk(0)]


def test_a_checkpointed_job_acknowledges_a_push_once_its_log_wrote_it(tmp_path):
    job = new_job(tmp_path)
    out = push(job, 10)
    assert isinstance(out[0], LogChunk) and out[0].chunk == 0 and out[0].frame is not None
    assert not any(isinstance(s, Ack) for s in out)
    out = feed(job, LogWritten())
    assert [type(s) for s in out] == [Ack, ResumeDispatch]


# ----------------------------------------------------------------- progress
def test_progress_completes_each_epoch_once_and_asks_for_idle_when_nothing_is_left():
    job = new_job()
    push(job, 2 << EPOCH_BITS)  # two epochs
    (d,) = dispatched(feed(job, DispatchReady(0.0)))
    first = {0: d.counts[0]}
    assert feed(job, Progress(b"w0", {0: {op: -k for op, k in first[0].items()}}, 1.0)) == [Moved()]
    assert job.tracker.completed == 1 << EPOCH_BITS
    assert feed(job, Progress(b"w0", {0: {op: -k for op, k in first[0].items()}}, 1.0)) == []  # again: nothing
    assert feed(job, Progress(b"w1", {1: {op: -k for op, k in d.counts[1].items()}}, 1.0)) == [
        Moved(), MaybeIdle()]
    assert job.tracker.completed == 2 << EPOCH_BITS


def test_a_dispatch_step_asks_for_the_next_only_when_it_could_send():
    """The batch stopped the step and the window has room: `ResumeDispatch` (the dispatcher does not look
    again on its own); the window stopped it, or the queue is empty: nothing more."""
    job = new_job(window=3 << EPOCH_BITS, batch=1 << EPOCH_BITS)
    push(job, 4 << EPOCH_BITS)
    for _ in range(2):
        out = feed(job, DispatchReady(0.0))
        assert dispatched(out)[0].count == 1 << EPOCH_BITS and out[-1] == ResumeDispatch()
    out = feed(job, DispatchReady(0.0))
    assert dispatched(out)[0].count == 1 << EPOCH_BITS and ResumeDispatch() not in out  # the window is full
    assert feed(job, DispatchReady(0.0)) == []
    job = new_job()
    push(job, 100)
    out = feed(job, DispatchReady(0.0))
    assert dispatched(out)[0].count == 100 and ResumeDispatch() not in out  # nothing left


def test_a_push_or_a_log_write_wakes_the_dispatch_only_when_its_records_may_leave(tmp_path):
    """With checkpoints a push waits for its log write (the write wakes the dispatch, the push does not);
    without, the push does; a full window wakes nothing (progress will)."""
    job = new_job(tmp_path)
    out = push(job, 100)
    assert isinstance(out[0], LogChunk) and ResumeDispatch() not in out
    assert [type(s) for s in feed(job, LogWritten())] == [Ack, ResumeDispatch]
    job = new_job(window=1 << EPOCH_BITS, batch=1 << EPOCH_BITS)
    assert ResumeDispatch() in push(job, 1 << EPOCH_BITS)
    dispatched(feed(job, DispatchReady(0.0)))
    assert ResumeDispatch() not in push(job, 10, req=2)


def test_a_report_wakes_the_dispatch_only_when_half_a_batch_may_leave():
    """A report that frees less of the window than half a batch, or leaves nothing queued, asks for no
    dispatch step (it would send nothing); the checkpointer is told that records moved (`Moved`)."""
    job = new_job(window=4 << EPOCH_BITS, batch=4 << EPOCH_BITS)
    push(job, 6 << EPOCH_BITS)
    (d,) = dispatched(feed(job, DispatchReady(0.0)))
    assert d.count == 4 << EPOCH_BITS and job.queued == 2 << EPOCH_BITS
    one = {e: {op: -k for op, k in d.counts[e].items()} for e in (0,)}
    assert feed(job, Progress(b"w0", one, 1.0)) == [Moved()]  # a quarter of the window: too little
    assert feed(job, DispatchReady(1.0)) == []  # as the step it no longer wakes would have found
    two = {e: {op: -k for op, k in d.counts[e].items()} for e in (1,)}
    assert feed(job, Progress(b"w0", two, 1.0)) == [ResumeDispatch()]  # half: it may leave
    (d2,) = dispatched(feed(job, DispatchReady(1.0)))
    assert d2.count == 2 << EPOCH_BITS and not job.queued
    rest = {e: {op: -k for op, k in d.counts[e].items()} for e in (2, 3)}
    assert feed(job, Progress(b"w1", rest, 1.0)) == [Moved()]  # nothing queued
    assert feed(job, Progress(b"w1", finish(d2), 1.0)) == [Moved(), MaybeIdle()]
    assert feed(job, Progress(b"w1", finish(d2), 1.0)) == []  # again: nothing completed, nothing at all

    job = new_job(window=4 << EPOCH_BITS, batch=4 << EPOCH_BITS)
    push(job, 4 << EPOCH_BITS)
    (d,) = dispatched(feed(job, DispatchReady(0.0)))
    job.queue.append([1 << CHUNK_BITS, None, 0])  # a replayed chunk on disk: reading it in is a step
    assert feed(job, Progress(b"w0", one, 1.0)) == [ResumeDispatch()]


def test_a_reader_s_completed_source_chunk_gives_its_credit_back():
    job = new_job()
    first = job.tracker.lease(1)
    job.tracker.sealed(first, 4, {first << (CHUNK_BITS - EPOCH_BITS): {0: 4}}, 0.0, reader="w1")
    out = feed(job, Progress(b"w1", {first << (CHUNK_BITS - EPOCH_BITS): {0: -4}}, 1.0))
    assert out == [Moved(), SendCredit(), MaybeIdle()]


def test_reports_during_a_rollback_or_from_a_worker_it_retired_are_stale(tmp_path):
    job = new_job(tmp_path)
    push(job, 100)
    feed(job, LogWritten())
    (d,) = dispatched(feed(job, DispatchReady(0.0)))
    job.machine.handle(RollBack("worker w1 died"))
    assert feed(job, Progress(b"w0", finish(d), 1.0)) == [] and job.tracker.completed == 0
    job.machine.handle(RolledBack())
    job.retired.add("w1")
    assert feed(job, Progress(b"w1", finish(d), 1.0)) == [] and job.tracker.completed == 0
    assert feed(job, Progress(b"w0", finish(d), 1.0)) == [Moved(), MaybeIdle()]


def test_without_checkpoints_no_report_is_stale():
    job = new_job()
    push(job, 10)
    (d,) = dispatched(feed(job, DispatchReady(0.0)))
    job.retired.add("w1")  # re-planned without it: what it finished still counts
    assert feed(job, Progress(b"w1", finish(d), 1.0)) == [Moved(), MaybeIdle()]


@pytest.mark.parametrize("under_way, end", [(Barrier(), BarrierSent()), (Migrate(), Migrated())])
def test_a_death_during_a_checkpoint_or_a_migration_rolls_back_and_voids_the_reports_of_its_era(
        tmp_path, under_way, end):
    """Until the rollback begins the survivors' reports count; from then on none does, and what was pushed
    meanwhile waits in the queue for the replay."""
    job = new_job(tmp_path)
    push(job, 1000)
    feed(job, LogWritten())
    (d,) = dispatched(feed(job, DispatchReady(0.0)))
    job.machine.handle(under_way)
    assert job.machine.handle(WorkerDied("w1")) == [FailRequests("w1"), StartRollback("worker w1 died")]
    half = {0: d.counts[0]}
    assert feed(job, Progress(b"w0", {0: {op: -k for op, k in half[0].items()}}, 1.0)) == [Moved()]
    assert job.machine.handle(end) == [ResumeDispatch()]
    job.machine.handle(RollBack("worker w1 died"))
    job.retired.add("w1")
    push(job, 50, req=2)
    feed(job, LogWritten())
    assert feed(job, DispatchReady(1.0)) == [] and job.queued == 50
    assert feed(job, Progress(b"w0", {1: {op: -k for op, k in d.counts[1].items()}}, 1.0)) == []
    assert job.tracker.completed == 1 << EPOCH_BITS
    assert job.machine.handle(RolledBack()) == [ResumeDispatch()]
    assert feed(job, Progress(b"w1", {1: {op: -k for op, k in d.counts[1].items()}}, 1.0)) == []  # retired: stale
    assert [x.count for x in dispatched(feed(job, DispatchReady(2.0)))] == [50]


# ----------------------------------------------------------------- retire, restart
def test_a_retired_job_emits_nothing_but_its_retire_instructions():
    job = new_job()
    push(job, 3000)
    (d,) = dispatched(feed(job, DispatchReady(0.0)))
    assert job.machine.handle(Retire()) == [DropInput(), StopWorkers(), Forget(delete_files=False)]
    assert feed(job, DispatchReady(1.0)) == []
    assert feed(job, Progress(b"w0", finish(d), 1.0)) == [] and job.tracker.completed == 0
    assert all(isinstance(s, Refuse) for s in push(job, 10))
    assert job.machine.handle(WorkerDied("w0")) == []


def test_a_restarted_planner_admits_but_holds_the_job_until_it_rolled_back(tmp_path):
    job = new_job(tmp_path, phase=Phase.TAKEN_UP)
    out = push(job, 100)
    assert isinstance(out[0], LogChunk) and job.queued == 100
    assert [type(s) for s in feed(job, LogWritten())] == [Ack]  # held: its rollback resumes it
    assert feed(job, DispatchReady(0.0)) == []
    assert job.machine.handle(WorkerDied("w1")) == [FailRequests("w1"), StartRollback("worker w1 died")]
    job.machine.handle(RollBack("planner restarted"))
    assert feed(job, DispatchReady(0.0)) == []
    assert job.machine.handle(RolledBack()) == [ResumeDispatch()]
    assert [d.count for d in drain(job)] == [100] and job.tracker.completed == 100


def test_an_orphaned_job_dispatches_on_and_rolls_back_onto_a_joining_worker(tmp_path):
    job = new_job(tmp_path)
    job.machine.handle(RollBack("worker w0 died"))
    assert job.machine.handle(NoWorkerLeft("worker w0 died")) == [ResumeDispatch()]
    push(job, 10)
    feed(job, LogWritten())
    assert dispatched(feed(job, DispatchReady(0.0)))  # to nothing: its pushers are the shell's
    assert job.machine.handle(WorkerJoined("w2")) == [StartRollback("worker w0 died")]


# ----------------------------------------------------------------- any sequence of events
PHASE_EVENTS = [Migrate(), Migrated(), Barrier(), BarrierSent(), RollBack("x"), RolledBack(), NoWorkerLeft("x"),
                WorkerJoined("w2"), WorkerDied("w1")]
EVENT = st.one_of(st.tuples(st.just("push"), st.integers(1, 1500)), st.tuples(st.just("dispatch"), st.just(0)),
                  st.tuples(st.just("report"), st.integers(0, 50)), st.tuples(st.just("retire"), st.just(0)),
                  st.tuples(st.just("phase"), st.integers(0, len(PHASE_EVENTS) - 1)))


@settings(max_examples=150, deadline=None)
@given(st.lists(EVENT, max_size=60), st.booleans())
def test_invariants_over_any_sequence_of_events(events, checkpoints):
    """Nothing leaves outside a dispatching phase; a retired job emits nothing after its retire
    instructions; no epoch completes twice, and the completed count is exactly the completed epochs'."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        job = new_job(tmp if checkpoints else None, window=1200, batch=700)
        sent: list[Dispatch] = []
        done: set[int] = set()
        retired = False
        for kind, arg in events:
            phase = job.life.phase
            open_before = {e: ep[1] for e, ep in job.tracker.epochs.items()}
            completed_before = job.tracker.completed
            if kind == "push":
                out = push(job, arg)
            elif kind == "dispatch":
                out = feed(job, DispatchReady(1.0))
                feed(job, LogWritten())
            elif kind == "report":
                if not sent:
                    continue
                out = feed(job, Progress(b"w0", finish(sent[arg % len(sent)]), 2.0))  # duplicates included
            elif kind == "retire":
                if retired:
                    with pytest.raises(InvalidTransition):
                        job.machine.handle(Retire())
                    continue
                out = job.machine.handle(Retire())
                assert out == [DropInput(), StopWorkers(), Forget(delete_files=checkpoints)]
                retired = True
                continue
            else:
                try:
                    out = job.machine.handle(PHASE_EVENTS[arg])
                except InvalidTransition:
                    assert job.life.phase is phase
                    continue
            ds = dispatched(out)
            if ds:
                assert phase in DISPATCHING
            sent += ds
            if retired:
                assert all(isinstance(s, Refuse) for s in out), out
            closed = open_before.keys() - job.tracker.epochs.keys()
            assert not closed & done
            done |= closed
            assert job.tracker.completed - completed_before == sum(open_before[e] for e in closed)
            assert job.tracker.completed <= job.counters["dispatched"]
