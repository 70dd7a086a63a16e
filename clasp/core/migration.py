"""The decentralized migration plan (paper §4.4, Fig. 7) and each worker's progress through it. Pure.

Protocol, for a change of a job's placement from epoch e to e+1:

1. The planner diffs the placements (`plan_migration`): key groups changing owner, stateless operators a
   worker loses (their queued requests go to one new holder), and from that, per worker, the peers it
   sends to, the peers it receives from, and the senders whose epoch-e *markers* it must see first.
2. It broadcasts the plan, sends its own markers, and routes new input by epoch e+1.
3. Each worker, on the plan: flushes the requests it had batched under epoch e, sends a marker to every
   peer that waits for one from it, switches its routing to e+1, and holds (in arrival order) the
   requests for the key groups whose state is coming to it; everything else keeps running.
4. A losing worker, once it has every marker it waits for (so no epoch-e request for what it loses is
   still on the way), drains its running executions and, in one step of its event loop, takes out the
   state and queued requests that are no longer its own and sends them directly to each new owner.
5. A gaining worker waits only for the peers the plan says will send to it;
6. as each key group arrives it installs the state, queues the requests that came with it, then the
   ones it held for it (the group resumes);
7. every worker reports completion to the planner. No global barrier; the planner moves no data.

Per-key order holds: a sender's epoch-e requests for a moved key reach the old owner before its marker,
so they travel inside the migration message, which the new owner applies before any epoch-e+1 request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from clasp.core.dag import DagSpec
from clasp.core.routing import OperatorPlacement, Placement

PLANNER = "planner"  # the sender name of the planner's markers


@dataclass
class MigrationPlan:
    """Who sends what to whom when a job goes from `old` to `new` (epoch `new.epoch`)."""

    epoch: int
    moves: dict[str, dict[tuple[str, str], list[int]]]  # stateful op -> (from, to) -> key groups
    handoffs: dict[str, dict[str, str]]  # stateless op -> worker losing it -> worker taking its queue
    markers: dict[str, list[str]]  # worker -> senders whose epoch markers it waits for
    sends_to: dict[str, list[str]]
    receives_from: dict[str, list[str]]
    participants: list[str]  # every worker of the job: all get the plan
    dead: list[str] = field(default_factory=list)  # workers excluded: nothing is expected from them

    def markers_to_send(self, sender: str) -> list[str]:
        """The workers that wait for `sender`'s marker."""
        return sorted(w for w, senders in self.markers.items() if sender in senders)

    def moved_groups(self) -> int:
        return sum(len(g) for m in self.moves.values() for g in m.values())

    def to_wire(self) -> dict:
        return {"epoch": self.epoch,
                "moves": {o: [[a, b, g] for (a, b), g in m.items()] for o, m in self.moves.items()},
                "handoffs": self.handoffs, "markers": self.markers, "sends_to": self.sends_to,
                "receives_from": self.receives_from, "participants": self.participants, "dead": self.dead}

    @classmethod
    def from_wire(cls, d: dict) -> MigrationPlan:
        try:
            moves = {str(o): {(str(a), str(b)): [int(x) for x in g] for a, b, g in m} for o, m in d["moves"].items()}
            return cls(int(d["epoch"]), moves,
                       {str(o): {str(a): str(b) for a, b in h.items()} for o, h in d["handoffs"].items()},
                       {str(w): [str(s) for s in v] for w, v in d["markers"].items()},
                       {str(w): [str(s) for s in v] for w, v in d["sends_to"].items()},
                       {str(w): [str(s) for s in v] for w, v in d["receives_from"].items()},
                       [str(w) for w in d["participants"]], [str(w) for w in d.get("dead", [])])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed migration plan: {type(e).__name__}: {e}") from None


def plan_migration(spec: DagSpec, old: Placement, new: Placement, participants: Iterable[str],
                   dead: Iterable[str] = ()) -> MigrationPlan:
    """Step 1: the plan from the old and the new placement. Workers in `dead` send nothing (their state
    is lost) and are waited for by no one."""
    dead = set(dead)
    moves: dict[str, dict[tuple[str, str], list[int]]] = {}
    handoffs: dict[str, dict[str, str]] = {}
    lost_ops: dict[str, set[int]] = {}  # worker -> indices of operators it gives something away of
    sends: dict[str, set[str]] = {}
    for o in spec.operators:
        po, pn = old.operators[o.name], new.operators[o.name]
        if o.stateful:
            m: dict[tuple[str, str], list[int]] = {}
            for g, (a, b) in enumerate(zip(po.key_groups, pn.key_groups, strict=True)):
                if a != b:
                    m.setdefault((a, b), []).append(g)
            if m:
                moves[o.name] = m
            for a, b in m:
                if a not in dead:
                    sends.setdefault(a, set()).add(b)
                    lost_ops.setdefault(a, set()).add(o.index)
        else:
            holders = pn.workers()
            # The new holder with the largest share takes a lost queue: one peer per loss, deterministic.
            heir = min(holders, key=lambda w: (-pn.shares[w], w))
            h = {w: heir for w in po.workers() if pn.shares.get(w, 0.0) <= 0 and w not in dead}
            if h:
                handoffs[o.name] = h
            for a, b in h.items():
                sends.setdefault(a, set()).add(b)
                lost_ops.setdefault(a, set()).add(o.index)
    predecessors: dict[int, set[int]] = {}
    for o in spec.operators:
        for s in o.successors:
            predecessors.setdefault(s, set()).add(o.index)
    sources = set(spec.sources)
    markers: dict[str, list[str]] = {}
    for w, ops in lost_ops.items():
        senders: set[str] = set()
        for i in ops:
            if i in sources:
                senders.add(PLANNER)
            for p in predecessors.get(i, ()):
                senders.update(old.operators[spec.operators[p].name].workers())
        senders -= {w} | dead
        if senders:
            markers[w] = sorted(senders)
    receives: dict[str, set[str]] = {}
    for a, bs in sends.items():
        for b in bs:
            receives.setdefault(b, set()).add(a)
    return MigrationPlan(new.epoch, moves, handoffs, markers, {w: sorted(v) for w, v in sends.items()},
                         {w: sorted(v) for w, v in receives.items()}, sorted(set(participants) - dead), sorted(dead))


def incoming_groups(plan: MigrationPlan, spec: DagSpec, me: str) -> dict[int, set[int]]:
    """The key groups whose state `plan` moves to worker `me` from a live worker, by operator index: their
    requests wait until it arrives. A dead worker's groups restart empty at once."""
    index = {o.name: o.index for o in spec.operators}
    incoming: dict[int, set[int]] = {}
    for op, moves in plan.moves.items():
        for (src, dst), groups in moves.items():
            if dst == me and src not in plan.dead:
                incoming.setdefault(index[op], set()).update(groups)
    return incoming


def groups_from(plan: MigrationPlan, spec: DagSpec, sender: str, me: str) -> dict[int, list[int]]:
    """The key groups `plan` moves from `sender` to `me`, by operator index."""
    index = {o.name: o.index for o in spec.operators}
    out: dict[int, list[int]] = {}
    for op, moves in plan.moves.items():
        groups = moves.get((sender, me))
        if groups:
            out[index[op]] = groups
    return out


def request_owner(p: OperatorPlacement, me: str, group: int | None) -> str | None:
    """The worker that should run a request of an operator placed as `p`, None when it is `me`: the owner of
    the request's key group `group` for a stateful operator; for a stateless one (`group` None), `me` while it
    holds a share, else the holder of the largest share (the least id among equals)."""
    if group is not None:
        w = p.key_groups[group]
    elif p.shares.get(me, 0.0) > 0:
        return None
    else:
        w = min(p.workers(), key=lambda x: (-p.shares[x], x))
    return None if w == me else w


@dataclass
class WorkerMigration:
    """One worker's progress through a plan: events in (`marker`, `received`), what to do next out."""

    plan: MigrationPlan
    me: str
    awaiting_markers: set[str] = field(default_factory=set)
    awaiting_state: set[str] = field(default_factory=set)
    sent: bool = False  # step 4 has begun: what this worker gives away is being taken out
    delivered: bool = False  # step 4 is over: the last message to every receiver is on its way

    def __post_init__(self) -> None:
        self.awaiting_markers = set(self.plan.markers.get(self.me, ()))
        self.awaiting_state = set(self.plan.receives_from.get(self.me, ()))
        self.sent = self.delivered = not self.plan.sends_to.get(self.me)

    def marker(self, sender: str) -> None:
        self.awaiting_markers.discard(sender)

    def start_sending(self) -> None:
        self.sent = True

    def finish_sending(self) -> None:
        self.delivered = True

    def received(self, sender: str) -> None:
        self.awaiting_state.discard(sender)

    def forget(self, workers: Iterable[str]) -> None:
        """Peers declared dead: stop waiting for them."""
        for w in workers:
            self.awaiting_markers.discard(w)
            self.awaiting_state.discard(w)

    @property
    def ready_to_send(self) -> bool:
        """Step 4 may run: every epoch-e request for what this worker loses has arrived."""
        return not self.sent and not self.awaiting_markers

    @property
    def done(self) -> bool:
        """Steps 5-6 are over: everything this worker sends is sent and everything it gets has come. Not
        before the last slice of step 4 left: step 4 yields to the event loop between slices."""
        return self.delivered and not self.awaiting_state
