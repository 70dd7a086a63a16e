"""A job's phase on the planner (clasp.core.lifecycle): events in, instructions out, no processes."""

from __future__ import annotations

import pytest

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
    Replan,
    ResumeDispatch,
    Retire,
    RollBack,
    RollbackFailed,
    RolledBack,
    StartRollback,
    StopWorkers,
    WorkerDied,
    WorkerJoined,
)


def test_a_migration_stops_decisions_and_resumes_dispatch_when_done():
    life = JobLife(checkpoints=True)
    assert life.handle(Migrate()) == []
    assert life.migrating and life.may_dispatch and not life.restoring
    assert life.handle(Migrated()) == [ResumeDispatch()]
    assert life.phase is Phase.RUNNING and not life.migrating


def test_a_barrier_holds_dispatch_until_every_worker_took_it():
    life = JobLife(checkpoints=True)
    assert life.handle(Barrier()) == []
    assert not life.may_dispatch and life.phase is Phase.BARRIER
    assert life.handle(BarrierSent()) == [ResumeDispatch()]
    assert life.may_dispatch


def test_worker_death_during_a_migration_fails_its_requests_then_rolls_back():
    life = JobLife(checkpoints=True)
    life.handle(Migrate())
    assert life.handle(WorkerDied("w1")) == [FailRequests("w1"), StartRollback("worker w1 died")]
    assert life.migrating  # the migration ends first (its requests failed); the rollback follows under the lock
    assert life.handle(Migrated()) == [ResumeDispatch()]
    assert life.handle(RollBack("worker w1 died")) == []
    assert life.restoring and not life.may_dispatch
    assert life.handle(RolledBack()) == [ResumeDispatch()]
    assert life.phase is Phase.RUNNING


def test_worker_death_during_a_checkpoint_gives_the_checkpoint_up_then_rolls_back():
    life = JobLife(checkpoints=True)
    life.handle(Barrier())
    assert life.handle(WorkerDied("w0")) == [FailRequests("w0"), StartRollback("worker w0 died")]
    assert life.handle(BarrierSent()) == [ResumeDispatch()]
    life.handle(RollBack("worker w0 died"))
    assert life.handle(RolledBack()) == [ResumeDispatch()]


def test_without_checkpoints_a_death_replans_and_never_rolls_back():
    life = JobLife(checkpoints=False)
    assert life.handle(WorkerDied("w2")) == [FailRequests("w2"), Replan("w2")]
    life.handle(Migrate())
    assert life.handle(WorkerDied("w3")) == [FailRequests("w3"), Replan("w3")]


def test_a_job_that_lost_every_worker_waits_and_rolls_back_onto_the_next_one():
    life = JobLife(checkpoints=True)
    life.handle(RollBack("worker w0 died"))
    assert life.handle(NoWorkerLeft("worker w0 died")) == [ResumeDispatch()]
    assert life.orphaned == "worker w0 died" and not life.restoring
    assert life.handle(WorkerJoined("w5")) == [StartRollback("worker w0 died")]
    life.handle(RollBack(life.orphaned))
    assert life.orphaned is None and life.restoring
    assert life.handle(RolledBack()) == [ResumeDispatch()]
    assert life.orphaned is None and life.phase is Phase.RUNNING


def test_a_restarted_planner_holds_the_job_until_its_rollback():
    life = JobLife(checkpoints=True, phase=Phase.TAKEN_UP)
    assert life.restoring and not life.may_dispatch
    assert life.handle(WorkerDied("w1")) == [FailRequests("w1"), StartRollback("worker w1 died")]
    life.handle(RollBack("planner restarted"))
    assert life.handle(RolledBack()) == [ResumeDispatch()]
    assert life.may_dispatch


def test_a_rollback_that_fails_resumes_dispatch():
    life = JobLife(checkpoints=True)
    life.handle(RollBack("worker w0 died"))
    assert life.handle(RollbackFailed()) == [ResumeDispatch()]
    assert life.phase is Phase.RUNNING


@pytest.mark.parametrize("phase, event", [
    (Phase.RUNNING, Migrated()), (Phase.RUNNING, BarrierSent()), (Phase.RUNNING, RolledBack()),
    (Phase.BARRIER, Migrate()), (Phase.ROLLING_BACK, Migrate()), (Phase.ROLLING_BACK, Barrier()),
    (Phase.MIGRATING, RollBack("x")), (Phase.TAKEN_UP, Barrier()),
])
def test_an_event_the_phase_does_not_accept_is_refused_and_changes_nothing(phase, event):
    life = JobLife(checkpoints=True, phase=phase)
    with pytest.raises(InvalidTransition):
        life.handle(event)
    assert life.phase is phase


@pytest.mark.parametrize("phase", [p for p in Phase if p is not Phase.RETIRED])
@pytest.mark.parametrize("checkpoints", [True, False])
def test_a_job_retires_from_any_phase_and_what_was_under_way_ends_without_consequence(phase, checkpoints):
    """A cancel in any phase: the input is dropped, the workers told, the job forgotten (its files too when it
    had checkpoints); then it admits and dispatches nothing, a second cancel is refused, and the ends of a
    migration, barrier or rollback under way, a death or a join, start nothing."""
    life = JobLife(checkpoints=checkpoints, phase=phase)
    assert life.handle(Retire()) == [DropInput(), StopWorkers(), Forget(delete_files=checkpoints)]
    assert life.retired and not life.may_dispatch and not life.migrating and not life.restoring
    for late in (Migrated(), BarrierSent(), RolledBack(), RollbackFailed(), NoWorkerLeft("x"), WorkerDied("w0"),
                 WorkerJoined("w1"), Migrate(), Barrier(), RollBack("x")):
        assert life.handle(late) == []
        assert life.phase is Phase.RETIRED
    with pytest.raises(InvalidTransition):
        life.handle(Retire())
