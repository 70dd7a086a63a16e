"""A job's phase on the planner as a pure state machine: events in, instructions out, every transition in
one table (`TRANSITIONS`), in the manner of h11's `_state.py`.

The phases are those in which the planner treats a job differently: it dispatches only while `RUNNING`
(and `ORPHANED`, where nothing is left to dispatch to); a migration (`MIGRATING`) stops the control loop's
decisions and the sweep of lost records; a checkpoint barrier (`BARRIER`) holds dispatch at a chunk
boundary; a rollback (`ROLLING_BACK`) holds dispatch and makes progress reports stale; a job that lost
every worker (`ORPHANED`) waits for one to join; a job taken up by a restarted planner (`TAKEN_UP`) waits
for its workers to register again; a cancelled job (`RETIRED`) admits and dispatches nothing, and what was under
way when it retired ends without consequence. The job's machine (`clasp.core.job_machine`) takes every event
of the job and hands these to it; admission, dispatch and progress are its transitions, by the phase. The shell
(clasp.runtime) feeds the events and carries out the instructions; the job's lock still orders the
migrations, checkpoints and rollbacks themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Phase(Enum):
    RUNNING = "running"
    MIGRATING = "migrating"
    BARRIER = "barrier"
    ROLLING_BACK = "rolling back"
    ORPHANED = "orphaned"
    TAKEN_UP = "taken up"
    RETIRED = "retired"


# ----------------------------------------------------------------- events
@dataclass(frozen=True)
class Migrate:
    """A migration to a new placement begins (its markers and plans are about to go out)."""


@dataclass(frozen=True)
class Migrated:
    """Every participant answered the migration (or failed)."""


@dataclass(frozen=True)
class Barrier:
    """A checkpoint reached a chunk boundary: its barrier goes out now."""


@dataclass(frozen=True)
class BarrierSent:
    """Every worker took the barrier (or the checkpoint failed)."""


@dataclass(frozen=True)
class RollBack:
    """A rollback to the last complete checkpoint begins."""
    cause: str


@dataclass(frozen=True)
class RolledBack:
    """The survivors restored and the replay is queued."""


@dataclass(frozen=True)
class RollbackFailed:
    """The rollback stopped on an error (the job's workers are as the error left them)."""


@dataclass(frozen=True)
class NoWorkerLeft:
    """The rollback found no worker to restore on."""
    cause: str


@dataclass(frozen=True)
class WorkerDied:
    """A worker of the job was declared dead."""
    worker: str


@dataclass(frozen=True)
class Retire:
    """The job is cancelled, in whatever phase it is."""


@dataclass(frozen=True)
class WorkerJoined:
    """A worker registered and took the job (deployed holding nothing)."""
    worker: str


# ----------------------------------------------------------------- instructions
@dataclass(frozen=True)
class ResumeDispatch:
    """Wake the dispatcher: what held dispatch is over."""


@dataclass(frozen=True)
class FailRequests:
    """Fail now what waits on `worker`, and the job's migration and checkpoint requests."""
    worker: str


@dataclass(frozen=True)
class StartRollback:
    """Roll the job back to its last complete checkpoint (under its lock)."""
    cause: str


@dataclass(frozen=True)
class Replan:
    """Re-place the dead worker's share on the survivors (a job without checkpoints: its state is lost)."""
    worker: str


@dataclass(frozen=True)
class DropInput:
    """Drop the job's queued input; pushes are refused from now on."""


@dataclass(frozen=True)
class StopWorkers:
    """Tell the job's workers to stop it and let go of its state, sources and sinks."""


@dataclass(frozen=True)
class Forget:
    """Forget the job; `delete_files`: its checkpoints and input log go too."""
    delete_files: bool


class InvalidTransition(Exception):
    """An event the job's phase does not accept (a bug in the shell that fed it)."""


class JobLife:
    """One job's phase. `checkpoints`: whether a worker's death rolls the job back (else it is re-planned)."""

    __slots__ = ("phase", "checkpoints", "orphan_cause", "_after")

    def __init__(self, checkpoints: bool, phase: Phase = Phase.RUNNING):
        self.phase = phase
        self.checkpoints = checkpoints
        self.orphan_cause: str | None = None
        self._after = Phase.RUNNING  # the phase a migration returns to

    # ----------------------------------------------------------------- what the shell reads
    @property
    def migrating(self) -> bool:
        return self.phase is Phase.MIGRATING

    @property
    def restoring(self) -> bool:
        """Rolling back, or waiting to: dispatch stops, progress reports are stale, no checkpoint starts."""
        return self.phase in (Phase.ROLLING_BACK, Phase.TAKEN_UP)

    @property
    def orphaned(self) -> str | None:
        return self.orphan_cause if self.phase is Phase.ORPHANED else None

    @property
    def may_dispatch(self) -> bool:
        return self.phase in (Phase.RUNNING, Phase.ORPHANED, Phase.MIGRATING)

    @property
    def retired(self) -> bool:
        """Cancelled: it admits nothing, and no checkpoint, migration or recovery starts for it."""
        return self.phase is Phase.RETIRED

    # ----------------------------------------------------------------- the transitions
    def handle(self, event) -> list:
        """Take `event`; returns the instructions for the shell. Raises InvalidTransition for an event the
        phase does not accept."""
        if isinstance(event, Retire):
            if self.phase is Phase.RETIRED:
                raise InvalidTransition("Retire while retired")
            self.phase = Phase.RETIRED
            return [DropInput(), StopWorkers(), Forget(delete_files=self.checkpoints)]
        if self.phase is Phase.RETIRED:
            return []  # what was under way when the job retired ends; nothing follows from it
        step = TRANSITIONS.get((self.phase, type(event)))
        if step is None:
            if isinstance(event, WorkerDied):
                return _died(self, event)
            if isinstance(event, WorkerJoined):
                return []
            raise InvalidTransition(f"{type(event).__name__} while {self.phase.value}")
        return step(self, event)


def _to(phase: Phase, *out):
    def step(life: JobLife, event) -> list:
        life.phase = phase
        return list(out)
    return step


def _migrate(life: JobLife, event: Migrate) -> list:
    life._after = life.phase
    life.phase = Phase.MIGRATING
    return []


def _migrated(life: JobLife, event: Migrated) -> list:
    life.phase = life._after
    return [ResumeDispatch()]


def _roll_back(life: JobLife, event: RollBack) -> list:
    life.phase = Phase.ROLLING_BACK
    return []


def _orphaned(life: JobLife, event: NoWorkerLeft) -> list:
    life.phase = Phase.ORPHANED
    life.orphan_cause = event.cause
    return [ResumeDispatch()]


def _rolled_back(life: JobLife, event: RolledBack) -> list:
    life.phase = Phase.RUNNING
    life.orphan_cause = None
    return [ResumeDispatch()]


def _died(life: JobLife, event: WorkerDied) -> list:
    """In any phase: what waits on the worker fails now (a migration or checkpoint under way gives up);
    the recovery follows under the job's lock."""
    if life.checkpoints:
        return [FailRequests(event.worker), StartRollback(f"worker {event.worker} died")]
    return [FailRequests(event.worker), Replan(event.worker)]


def _joined_orphan(life: JobLife, event: WorkerJoined) -> list:
    return [StartRollback(life.orphan_cause or f"worker {event.worker} joined")]


TRANSITIONS = {
    (Phase.RUNNING, Migrate): _migrate,
    (Phase.ORPHANED, Migrate): _migrate,
    (Phase.TAKEN_UP, Migrate): _migrate,
    (Phase.MIGRATING, Migrated): _migrated,
    (Phase.RUNNING, Barrier): _to(Phase.BARRIER),
    (Phase.BARRIER, BarrierSent): _to(Phase.RUNNING, ResumeDispatch()),
    (Phase.RUNNING, RollBack): _roll_back,
    (Phase.ORPHANED, RollBack): _roll_back,
    (Phase.TAKEN_UP, RollBack): _roll_back,
    (Phase.ROLLING_BACK, RolledBack): _rolled_back,
    (Phase.ROLLING_BACK, NoWorkerLeft): _orphaned,
    (Phase.ROLLING_BACK, RollbackFailed): _to(Phase.RUNNING, ResumeDispatch()),
    (Phase.ORPHANED, WorkerJoined): _joined_orphan,
}
