"""Every message of clasp's wire protocol, its encoding, and its validation.

A message is one ZeroMQ frame holding msgpack `[VERSION, type, body]` (a ROUTER socket adds the
sender's identity frame in front). `decode()` checks the envelope and the body's schema and raises
`ProtocolError(reason)` on anything else; callers count the reason in `clasp_bad_messages_total` and,
where the sender is known, answer it with an `error` message.

Message types and who sends them (C client, P planner, W worker):

| type | from → to | body |
| --- | --- | --- |
| register | W → P | id, host, data (PULL endpoint), state (ROUTER endpoint), metrics (URL), p_max, pid |
| welcome | P → W | planner id, heartbeat interval |
| heartbeat | W → P | id, sample (the worker's Table 2 metrics of the last interval) |
| deploy | P → W | req, job, dag (DagSpec.pack()), placement (Placement.to_wire()), peers {id: data endpoint} |
| data | P/W → W | [job, epoch, rows]: requests, each row [op, value, key, rid] |
| runs | P → W | [job, epoch, runs]: records for stateless sources, each run [op, first rid, values (or a segment)] |
| cols | W → W | [job, epoch, groups]: per operator [op, values (a list, or packed), keys, rids, counts(, groups)] |
| done | W → P | [job, {progress epoch: {op: requests produced − finished}}] — epoch progress (`clasp.core.tracking`) |
| migrate_plan | P → W | req, job, plan, placement; the reply comes when the worker is done |
| marker | P/W → W | [job, epoch, sender]: the sender's last message under the previous epoch |
| migrate | W → W | [job, epoch, sender, units, rows, more]: key groups and requests changing owner |
| scale, place, autoscale | C → P | req, job, workers / placement {op: {worker index: share}} / enabled |
| drain, pool | C → P | req, worker (migrate its shares away, then it exits) / nothing (the pool wish) |
| leave | W → P | id: the worker got SIGTERM and asks to be drained |
| peers | P → W | req, job, peers {id: data endpoint}: workers that joined the job's pool (connect now) |
| shutdown | P → W | ok, detail: drained (exit 0), or why it could not be (exit 1) |
| submit, push, wait_idle, state, collected, stats, cancel, jobs, workers | C → P | req plus the call's fields |
| push | C → P | req, job, and records (a list) or segments ([bin / ext SEG_LZ4], arrays of records: `pack_segments`) |
| state_get, state_put, state_dump, collected_dump, counters, stop_job | P/any → W | req plus fields |
| state_packed | P → W | req, job, op: as state_dump, the result one bin holding the msgpack map (`splice_maps`) |
| collected_dump | P → W | req, job, op: the result one bin holding the outputs' msgpack array (`splice_arrays`) |
| ckpt_begin | P → W | req, job, ckpt, boundary (record id): hold requests at or above it out of stateful operators |
| ckpt_snapshot | P → W | req, job, ckpt, boundary, dir: all below the boundary complete; write owned groups |
| (its reply) | | worker, groups, bytes, collected {op: bin, the outputs below the boundary as a msgpack array}, ... |
| ckpt_abort | P → W | req, job, ckpt: the checkpoint failed; release what the barrier holds |
| restore | P → W | req, job, dag, placement, peers, ckpt, groups {op: [g]}, dir: roll back to ckpt (0: empty) |
| restore (sinks) | P → W | optional: sinks {worker: {commit: owed commits, abort: dead workers' partitions}}, run |
| sink_commit | P → W | req, job, parts {partition: [sink, [[ckpt, prepared], ...]]}: commit, checkpoint complete |
| sink_flush | P → W | req, job, seq: checkpoints off: write, prepare and commit every sink partition now |
| lease | W → P | [job, chunks]: chunk ids for the batches its source readers will read (`clasp.core.tracking`) |
| leased | P → W | job, first, count: chunk ids `first .. first + count - 1`, this worker's to use |
| seal | W → P | [job, chunk, records, {epoch: {op: requests}}, mark?]: a batch read, handed to the successors |
| (mark) | | a partition on event time: [source operator, partition, time], its watermark after that chunk |
| seals | W → P | [job, [[chunk, records, counts, mark?], ...]]: the seals of one turn of the worker's event loop |
| read_end | W → P | [job, source operator, partition, epoch]: a bounded partition read to its end in that era |
| credit | P → W | job, records: records its readers read that are complete (the reader's window reopens) |
| watermark | P → W | job, watermark, levels (one per stage), round: fire the windows and timers due |
| wm_idle | W → P | [job, source operator, partition]: the partition went idle |
| wm_out | W → P | [job, chunk, records]: a chunk of fired windows' outputs (its seal follows) |
| wm_fired | W → P | [job, round, late]: the windows due at that round fired; records sent late so far |
| src_assign | P → W | req, job, parts [[op, partition, position]]: open readers of these partitions here |
| src_release | P → W | req, job, parts [[op, partition]]: stop reading them; the reply holds their positions |
| stop | C → P | req, job, timeout: stop reading the sources, finish what was read, take a last checkpoint |
| rstate_get_many | W → P state server | req, job, op, keys — reply {key: state} for the keys that have one |
| rstate_put_many | W → P state server | req, job, op, states {key: state, None deletes} — reply true |
| reply | any → requester | req, ok, result or error |
| error | any → sender of a bad message | reason, detail |

Every control message is typed: a frozen dataclass (`MESSAGES`) that `decode_message` builds and checks,
its body a map or, for a `Positional` one, a list; only the data path's per-batch bodies (data, runs, cols,
done, seal, seals) stay plain lists, checked by the `check_*` functions (docs/ARCHITECTURE.md, "Typed
control messages").

`deploy` has two optional fields: `state` is "local" or "remote" (then `state_server` is the planner's remote-state
endpoint, which serves `rstate_get_many` and `rstate_put_many`: `clasp/runtime/state_server.py`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from itertools import chain, groupby, repeat
from operator import is_, itemgetter
from typing import Any, ClassVar

import lz4.block
import msgpack

from clasp.core import kernels
from clasp.core.limits import LIMITS

VERSION = 1


class ProtocolError(ValueError):
    """A frame that is not a valid clasp message; `reason` is a short label for metrics."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.req: int | None = None  # the bad message's request id, when it has a readable one: answerable


_STR, _INT, _NUM, _BYTES, _DICT, _LIST, _BOOL = (str,), (int,), (int, float), (bytes,), (dict,), (list,), (bool,)
_ANY = None

# The fields of the map-bodied messages and their accepted types, required (`SCHEMAS`) and optional
# (`_OPTIONAL`), made from the typed messages' dataclass fields (`MESSAGES`, below).
SCHEMAS: dict[str, dict[str, tuple | None]] = {}
_OPTIONAL: dict[str, dict[str, tuple | None]] = {}
# List-bodied messages: their lengths; the first element is always the job id. The data path's (below) stay
# lists; the typed positional messages (`Positional`) add theirs, with their fields' types (`_POSITIONS`).
_LIST_BODIES = {"data": 3, "runs": 3, "cols": 3, "done": 3, "seal": 4, "seals": 2, "wm_push": 3}
# ... and a longer form some take: a seal with its partition's watermark mark.
_LIST_LONGER = {"seal": 5}  # the least length of a longer body (a seal's marks)
_POSITIONS: dict[str, list[tuple[str, tuple | None]]] = {}


# ----------------------------------------------------------------- typed control messages
# A typed message is a frozen dataclass: its fields are the body's, `_req(types)` required and `_opt(types)`
# optional (None when absent); `decode` checks their types, `parse` builds the dataclass and runs its
# `check` (what a type cannot say: a share is a number, a timeout is not negative). Handlers read
# attributes, never a raw body. A `Positional` message's body is its fields as a list, in order (compact,
# as the migration's and the readers' messages always were). The data path's per-batch bodies (rows, runs,
# columns, progress counts, seals) stay lists, checked by the `check_*` functions: no object per batch.
def _req(types: tuple | None) -> Any:
    return field(metadata={"types": types})


def _opt(types: tuple | None) -> Any:
    return field(default=None, metadata={"types": types, "optional": True})


class Message:
    """Base of the typed control messages; `TYPE` is the message type on the wire."""

    __slots__ = ()
    TYPE: ClassVar[str]

    def check(self) -> None:
        """Raise ProtocolError("bad_field", ...) for a value its type allows but the message does not."""

    def body(self) -> dict | list:
        """The wire body: every field, the optional ones only when set."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not (f.metadata.get("optional") and getattr(self, f.name) is None)}


class Positional(Message):
    """A typed message whose wire body is the list of its fields in order, the job id first."""

    __slots__ = ()

    def body(self) -> list:
        return [getattr(self, f.name) for f in fields(self)]


def _bad_field(mtype: str, name: str, what: str) -> ProtocolError:
    return ProtocolError("bad_field", f"{mtype}.{name}: {what}")


def _is_number(v: Any) -> bool:
    return type(v) in _NUM and math.isfinite(v)


def _check_shares(mtype: str, name: str, placement: dict | None) -> None:
    """A placement by index: operator name -> {worker index -> share}."""
    if placement is None:
        return
    for op, shares in placement.items():
        if type(op) is not str or type(shares) is not dict:
            raise _bad_field(mtype, name, "expected {operator: {worker index: share}}")
        for i, v in shares.items():
            if type(i) is not int or not _is_number(v):
                raise _bad_field(mtype, name, f"{op!r}: expected {{worker index: share}}, got {i!r}: {v!r}")


def _check_timeout(mtype: str, timeout: float) -> None:
    if not (timeout >= 0 and math.isfinite(timeout)):
        raise _bad_field(mtype, "timeout", f"{timeout!r} s")


# Client -> planner
@dataclass(frozen=True, slots=True)
class Request(Message):
    """A request that is answered with a `reply` carrying its `req`."""

    req: int = _req(_INT)


@dataclass(frozen=True, slots=True)
class JobRequest(Request):
    """A client's request about one of its jobs."""

    job: int = _req(_INT)


@dataclass(frozen=True, slots=True)
class Submit(Request):
    TYPE: ClassVar[str] = "submit"
    dag: dict = _req(_DICT)
    placement: dict | None = _opt(_DICT)  # {operator: {worker index: share}}
    options: dict | None = _opt(_DICT)  # policy, state, autoscale
    key_weights: dict | None = _opt(_DICT)  # {stateful operator: NUM_KEY_GROUPS numbers}

    def check(self) -> None:
        _check_shares(self.TYPE, "placement", self.placement)
        for name, types in (("policy", _STR), ("state", _STR), ("autoscale", _BOOL)):
            v = (self.options or {}).get(name)
            if v is not None and type(v) not in types:
                raise _bad_field(self.TYPE, f"options.{name}", type(v).__name__)
        if self.key_weights is not None and not all(type(k) is str for k in self.key_weights):
            raise _bad_field(self.TYPE, "key_weights", "expected {operator: weights}")

    @property
    def policy(self) -> str | None:
        return (self.options or {}).get("policy")

    @property
    def state(self) -> str | None:
        return (self.options or {}).get("state")

    @property
    def autoscale(self) -> bool | None:
        return (self.options or {}).get("autoscale")


@dataclass(frozen=True, slots=True)
class Push(JobRequest):
    """A client's records, either `records` (a list) or `segments`: msgpack arrays of consecutive records,
    packed by the client (`pack_segments`), which the planner checks without decoding and forwards to the
    workers as they came (`Segments`)."""

    TYPE: ClassVar[str] = "push"
    records: list | None = _opt(_LIST)
    segments: list | None = _opt(_LIST)  # [bin]: each a msgpack array of records

    def check(self) -> None:
        if self.records is None and self.segments is None:
            raise ProtocolError("missing_field", "push.records: missing (or segments)")
        if self.records is not None and self.segments is not None:
            raise ProtocolError("bad_field", "push.segments: given with records")
        if self.segments is not None:
            check_segments(self.segments)


@dataclass(frozen=True, slots=True)
class WaitIdle(JobRequest):
    TYPE: ClassVar[str] = "wait_idle"
    timeout: float = _req(_NUM)  # seconds

    def check(self) -> None:
        _check_timeout(self.TYPE, self.timeout)


@dataclass(frozen=True, slots=True)
class StateRequest(JobRequest):
    """The whole state of one stateful operator (wire type `state`)."""

    TYPE: ClassVar[str] = "state"
    op: str = _req(_STR)
    timeout: float | None = _opt(_NUM)  # seconds to wait for a recovering job (default: the planner's)

    def check(self) -> None:
        if self.timeout is not None:
            _check_timeout(self.TYPE, self.timeout)


@dataclass(frozen=True, slots=True)
class Collected(StateRequest):
    """What a collecting operator kept, from every worker."""

    TYPE: ClassVar[str] = "collected"


@dataclass(frozen=True, slots=True)
class Stats(JobRequest):
    TYPE: ClassVar[str] = "stats"
    fresh: bool | None = _opt(_BOOL)  # exact counters asked of every worker now


@dataclass(frozen=True, slots=True)
class Cancel(JobRequest):
    TYPE: ClassVar[str] = "cancel"


@dataclass(frozen=True, slots=True)
class Stop(JobRequest):
    """End a job on unbounded sources: readers stop, what was read completes, a last checkpoint is taken."""

    TYPE: ClassVar[str] = "stop"
    timeout: float = _req(_NUM)

    def check(self) -> None:
        _check_timeout(self.TYPE, self.timeout)


@dataclass(frozen=True, slots=True)
class EndInput(JobRequest):
    """No more pushes: the push source's watermark reaches the end once everything pushed is complete."""

    TYPE: ClassVar[str] = "end_input"


@dataclass(frozen=True, slots=True)
class Jobs(Request):
    TYPE: ClassVar[str] = "jobs"


@dataclass(frozen=True, slots=True)
class Workers(Request):
    TYPE: ClassVar[str] = "workers"


@dataclass(frozen=True, slots=True)
class Scale(JobRequest):
    TYPE: ClassVar[str] = "scale"
    workers: int = _req(_INT)


@dataclass(frozen=True, slots=True)
class Place(JobRequest):
    TYPE: ClassVar[str] = "place"
    placement: dict = _req(_DICT)  # {operator: {worker index: share}}

    def check(self) -> None:
        _check_shares(self.TYPE, "placement", self.placement)


@dataclass(frozen=True, slots=True)
class Autoscale(JobRequest):
    TYPE: ClassVar[str] = "autoscale"
    enabled: bool = _req(_BOOL)


@dataclass(frozen=True, slots=True)
class Drain(Request):
    TYPE: ClassVar[str] = "drain"
    worker: str = _req(_STR)


@dataclass(frozen=True, slots=True)
class Pool(Request):
    TYPE: ClassVar[str] = "pool"


# Worker -> planner (and any answer to a request)
@dataclass(frozen=True, slots=True)
class Register(Message):
    TYPE: ClassVar[str] = "register"
    id: str = _req(_STR)
    host: str = _req(_STR)
    data: str = _req(_STR)  # its PULL endpoint
    state: str = _req(_STR)  # its state server's ROUTER endpoint
    metrics: str = _req(_STR)  # its /metrics URL
    p_max: int = _req(_INT)
    pid: int = _req(_INT)


@dataclass(frozen=True, slots=True)
class Leave(Message):
    """A worker asks to be drained (it got SIGTERM); the planner answers with `shutdown`."""

    TYPE: ClassVar[str] = "leave"
    id: str = _req(_STR)


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    TYPE: ClassVar[str] = "heartbeat"
    id: str = _req(_STR)
    sample: dict = _req(_DICT)  # the worker's Table 2 metrics of the last interval (Monitor.sample)


@dataclass(frozen=True, slots=True)
class Reply(Request):
    TYPE: ClassVar[str] = "reply"
    ok: bool = _req(_BOOL)
    result: Any = _opt(_ANY)
    error: str | None = _opt(_STR)


@dataclass(frozen=True, slots=True)
class Error(Message):
    """The answer to a bad message: why it was dropped."""

    TYPE: ClassVar[str] = "error"
    reason: str = _req(_STR)
    detail: str = _req(_STR)


# Planner -> worker requests, and a worker's to the planner's remote-state server: each is answered with a
# `reply` carrying its `req`, which the sender sets as it sends (`Link.rpc`: `replace(msg, req=...)`).
@dataclass(frozen=True, slots=True)
class Call(Message):
    """A request to another process of the cluster; `req` is keyword-only, 0 until it is sent."""

    req: int = field(default=0, kw_only=True, metadata={"types": _INT})


@dataclass(frozen=True, slots=True)
class JobCall(Call):
    job: int = _req(_INT)


def _check_peers(mtype: str, peers: dict) -> None:
    if not all(type(w) is str and type(a) is str for w, a in peers.items()):
        raise _bad_field(mtype, "peers", "expected {worker id: data endpoint}")


def _check_state(msg: Deploy | Restore) -> None:
    if msg.state not in (None, "local", "remote"):
        raise _bad_field(msg.TYPE, "state", f"{msg.state!r}: expected 'local' or 'remote'")
    if msg.state == "remote" and msg.state_server is None:
        raise _bad_field(msg.TYPE, "state_server", "remote state needs the state server's endpoint")


def _check_parts(mtype: str, parts: list | None, n: int, what: str) -> None:
    """Source partitions as lists of `n`, the operator's and the partition's names first."""
    for p in parts or ():
        if type(p) is not list or len(p) != n or type(p[0]) is not str or type(p[1]) is not str:
            raise _bad_field(mtype, "parts" if mtype.startswith("src_") else "sources", f"each must be {what}")


@dataclass(frozen=True, slots=True)
class Deploy(JobCall):
    """Run a job here: its DAG, its placement, the workers it sends to."""

    TYPE: ClassVar[str] = "deploy"
    dag: dict = _req(_DICT)  # DagSpec.pack(), checked by DagSpec.unpack
    placement: dict = _req(_DICT)  # Placement.to_wire(), checked by Placement.from_wire
    peers: dict = _req(_DICT)  # {worker id: data endpoint}
    state: str | None = _opt(_STR)  # "local" (default) or "remote"
    state_server: str | None = _opt(_STR)  # the planner's remote-state endpoint
    floor: int | None = _opt(_INT)  # rows of an older epoch are void here
    run: str | None = _opt(_STR)  # the sinks' run id
    sources: list | None = _opt(_LIST)  # [[op, partition, owner, position]]

    def check(self) -> None:
        _check_peers(self.TYPE, self.peers)
        _check_state(self)
        _check_parts(self.TYPE, self.sources, 4, "[op, partition, owner, position]")


@dataclass(frozen=True, slots=True)
class Restore(JobCall):
    """Roll the job back to checkpoint `ckpt` (0: empty) on a recovery placement."""

    TYPE: ClassVar[str] = "restore"
    dag: dict = _req(_DICT)
    placement: dict = _req(_DICT)
    peers: dict = _req(_DICT)
    ckpt: int = _req(_INT)
    groups: dict = _req(_DICT)  # {operator: [key group]} the checkpoint holds
    dir: str = _req(_STR)  # the planner's checkpoint directory
    state: str | None = _opt(_STR)
    state_server: str | None = _opt(_STR)
    run: str | None = _opt(_STR)
    sinks: dict | None = _opt(_DICT)  # {worker: {commit: owed commits, abort: dead workers' partitions}}
    sources: list | None = _opt(_LIST)  # [[op, partition, owner, position]]
    watermark: list | None = _opt(_LIST)  # the checkpoint's watermark per stage

    def check(self) -> None:
        _check_peers(self.TYPE, self.peers)
        _check_state(self)
        _check_parts(self.TYPE, self.sources, 4, "[op, partition, owner, position]")
        if self.ckpt < 0:
            raise _bad_field(self.TYPE, "ckpt", str(self.ckpt))
        for op, gs in self.groups.items():
            if type(op) is not str or type(gs) is not list or not set(map(type, gs)) <= {int}:
                raise _bad_field(self.TYPE, "groups", "expected {operator: [key group]}")
        if self.sinks is not None and not all(type(w) is str and type(d) is dict for w, d in self.sinks.items()):
            raise _bad_field(self.TYPE, "sinks", "expected {worker: duties}")
        if self.watermark is not None and not set(map(type, self.watermark)) <= set(_NUM):
            raise _bad_field(self.TYPE, "watermark", "expected a number per stage")


@dataclass(frozen=True, slots=True)
class MigratePlan(JobCall):
    """Take part in a migration; answered when this worker is done (checked by MigrationPlan.from_wire)."""

    TYPE: ClassVar[str] = "migrate_plan"
    plan: dict = _req(_DICT)  # MigrationPlan.to_wire()
    placement: dict = _req(_DICT)  # the new epoch's Placement.to_wire()


@dataclass(frozen=True, slots=True)
class Peers(JobCall):
    """Workers that joined the job's pool: connect to them now."""

    TYPE: ClassVar[str] = "peers"
    peers: dict = _req(_DICT)

    def check(self) -> None:
        _check_peers(self.TYPE, self.peers)


@dataclass(frozen=True, slots=True)
class StopJob(JobCall):
    TYPE: ClassVar[str] = "stop_job"


@dataclass(frozen=True, slots=True)
class Counters(JobCall):
    """The job's counters here; with `below`, also whether anything of a record below that id is here; with
    `timers`, also the earliest processing-time timer not fired here."""

    TYPE: ClassVar[str] = "counters"
    below: int | None = _opt(_INT)
    timers: bool | None = _opt(_BOOL)  # also answer `timers`: the earliest processing-time timer not fired here


@dataclass(frozen=True, slots=True)
class StateDump(JobCall):
    """Every key's state of one operator held here."""

    TYPE: ClassVar[str] = "state_dump"
    op: str = _req(_STR)


@dataclass(frozen=True, slots=True)
class StatePacked(StateDump):
    """`state_dump`, answered with one bin holding the msgpack map: the planner splices its workers' maps
    into its answer (`splice_maps`, `Packed`) without decoding a key, merging dicts or encoding them again."""

    TYPE: ClassVar[str] = "state_packed"


@dataclass(frozen=True, slots=True)
class CollectedDump(StateDump):
    """What a collecting operator kept here."""

    TYPE: ClassVar[str] = "collected_dump"


@dataclass(frozen=True, slots=True)
class StateGet(StateDump):
    TYPE: ClassVar[str] = "state_get"
    key: Any = _req(_ANY)


@dataclass(frozen=True, slots=True)
class StatePut(StateGet):
    TYPE: ClassVar[str] = "state_put"
    value: Any = _req(_ANY)


@dataclass(frozen=True, slots=True)
class CkptAbort(JobCall):
    """The checkpoint failed: release what the barrier holds."""

    TYPE: ClassVar[str] = "ckpt_abort"
    ckpt: int = _req(_INT)

    def check(self) -> None:
        if self.ckpt <= 0:
            raise _bad_field(self.TYPE, "ckpt", str(self.ckpt))


@dataclass(frozen=True, slots=True)
class CkptBegin(CkptAbort):
    """Hold requests at or above `boundary` (a record id) out of stateful operators."""

    TYPE: ClassVar[str] = "ckpt_begin"
    boundary: int = _req(_INT)

    def check(self) -> None:
        CkptAbort.check(self)
        if self.boundary < 0:
            raise _bad_field(self.TYPE, "boundary", str(self.boundary))


@dataclass(frozen=True, slots=True)
class CkptSnapshot(CkptBegin):
    """Everything below the boundary is complete: write the owned key groups under `dir`."""

    TYPE: ClassVar[str] = "ckpt_snapshot"
    dir: str = _req(_STR)


@dataclass(frozen=True, slots=True)
class SinkCommit(JobCall):
    """A complete checkpoint: commit these partitions' prepared writes."""

    TYPE: ClassVar[str] = "sink_commit"
    parts: dict = _req(_DICT)  # {partition: [sink, [[ckpt, prepared], ...]]}

    def check(self) -> None:
        for name, v in self.parts.items():
            if (type(name) is not str or type(v) is not list or len(v) != 2 or type(v[0]) is not str
                    or type(v[1]) is not list):
                raise _bad_field(self.TYPE, "parts", "expected {partition: [sink, entries]}")


@dataclass(frozen=True, slots=True)
class SinkFlush(JobCall):
    """Checkpoints off: write, prepare and commit every sink partition now."""

    TYPE: ClassVar[str] = "sink_flush"
    seq: int = _req(_INT)


@dataclass(frozen=True, slots=True)
class SrcAssign(JobCall):
    """Open readers of these partitions here, at these positions."""

    TYPE: ClassVar[str] = "src_assign"
    parts: list = _req(_LIST)  # [[op, partition, position]]

    def check(self) -> None:
        _check_parts(self.TYPE, self.parts, 3, "[op, partition, position]")


@dataclass(frozen=True, slots=True)
class SrcRelease(JobCall):
    """Stop reading these partitions; the reply holds their positions."""

    TYPE: ClassVar[str] = "src_release"
    parts: list = _req(_LIST)  # [[op, partition]]

    def check(self) -> None:
        _check_parts(self.TYPE, self.parts, 2, "[op, partition]")


# A remote state's keys: what msgpack keeps as it is (and hashable).
STATE_KEY_TYPES = frozenset({str, int, float, bool, bytes, type(None)})


def _check_keys(mtype: str, name: str, keys) -> None:
    if not set(map(type, keys)) <= STATE_KEY_TYPES:
        bad = next(k for k in keys if type(k) not in STATE_KEY_TYPES)
        raise _bad_field(mtype, name, f"a key of type {type(bad).__name__}")


@dataclass(frozen=True, slots=True)
class RstateGetMany(StateDump):
    """The states of these keys on the remote-state server (a reply {key: state} for those that have one)."""

    TYPE: ClassVar[str] = "rstate_get_many"
    keys: list = _req(_LIST)

    def check(self) -> None:
        _check_keys(self.TYPE, "keys", self.keys)


@dataclass(frozen=True, slots=True)
class RstatePutMany(StateDump):
    """Write these keys' states on the remote-state server (None deletes a key)."""

    TYPE: ClassVar[str] = "rstate_put_many"
    states: dict = _req(_DICT)

    def check(self) -> None:
        _check_keys(self.TYPE, "states", self.states)


# Planner -> worker, not answered
@dataclass(frozen=True, slots=True)
class Welcome(Message):
    TYPE: ClassVar[str] = "welcome"
    planner: str = _req(_STR)
    heartbeat: float = _req(_NUM)  # seconds between heartbeats (0: the worker's own)

    def check(self) -> None:
        if not (self.heartbeat >= 0 and math.isfinite(self.heartbeat)):
            raise _bad_field(self.TYPE, "heartbeat", f"{self.heartbeat!r} s")


@dataclass(frozen=True, slots=True)
class Shutdown(Message):
    """The answer to `leave`: drained (exit 0), or why not (exit 1)."""

    TYPE: ClassVar[str] = "shutdown"
    ok: bool = _req(_BOOL)
    detail: str = _req(_STR)


@dataclass(frozen=True, slots=True)
class Credit(Message):
    """Records the worker's readers read that are complete: their window reopens by as many."""

    TYPE: ClassVar[str] = "credit"
    job: int = _req(_INT)
    records: int = _req(_INT)

    def check(self) -> None:
        if self.records < 0:
            raise _bad_field(self.TYPE, "records", str(self.records))


@dataclass(frozen=True, slots=True)
class Leased(Message):
    """Chunk ids `first .. first + count - 1` are this worker's to use (the answer to `lease`)."""

    TYPE: ClassVar[str] = "leased"
    job: int = _req(_INT)
    first: int = _req(_INT)
    count: int = _req(_INT)

    def check(self) -> None:
        if self.first < 0 or self.count <= 0:
            raise _bad_field(self.TYPE, "count", f"chunks {self.first} + {self.count}")


@dataclass(frozen=True, slots=True)
class Watermark(Message):
    """The released watermark, per stage (`levels`): fire what is due, answer `wm_fired` with `round`."""

    TYPE: ClassVar[str] = "watermark"
    job: int = _req(_INT)
    watermark: float = _req(_NUM)
    levels: list = _req(_LIST)
    round: int = _req(_INT)

    def check(self) -> None:
        if not self.levels or not set(map(type, self.levels)) <= set(_NUM):
            raise _bad_field(self.TYPE, "levels", "expected a number per stage")


# Worker -> planner, and worker -> worker on the data socket: positional bodies
MAX_LEASE = 1024  # chunk ids a reader may ask for at once


@dataclass(frozen=True, slots=True)
class Lease(Positional):
    """[job, chunks]: chunk ids for the batches this worker's readers will read."""

    TYPE: ClassVar[str] = "lease"
    job: int = _req(_INT)
    chunks: int = _req(_INT)

    def check(self) -> None:
        if not 0 < self.chunks <= MAX_LEASE:
            raise _bad_field(self.TYPE, "chunks", f"{self.chunks}: expected 1..{MAX_LEASE}")


@dataclass(frozen=True, slots=True)
class WmIdle(Positional):
    """[job, op, partition]: a partition with an event-time clock went idle."""

    TYPE: ClassVar[str] = "wm_idle"
    job: int = _req(_INT)
    op: str = _req(_STR)
    partition: str = _req(_STR)


@dataclass(frozen=True, slots=True)
class ReadEnd(WmIdle):
    """[job, op, partition, epoch]: a bounded partition read to its end in that era."""

    TYPE: ClassVar[str] = "read_end"
    epoch: int = _req(_INT)


@dataclass(frozen=True, slots=True)
class WmFired(Positional):
    """[job, round, late]: the windows due at watermark round `round` fired; records sent late so far."""

    TYPE: ClassVar[str] = "wm_fired"
    job: int = _req(_INT)
    round: int = _req(_INT)
    late: int = _req(_INT)


@dataclass(frozen=True, slots=True)
class WmOut(Positional):
    """[job, chunk, records]: a chunk of fired windows' outputs, not read from a source (its seal follows)."""

    TYPE: ClassVar[str] = "wm_out"
    job: int = _req(_INT)
    chunk: int = _req(_INT)
    records: int = _req(_INT)

    def check(self) -> None:
        if self.chunk < 0 or self.records <= 0:
            raise _bad_field(self.TYPE, "records", f"chunk {self.chunk}, {self.records} records")


@dataclass(frozen=True, slots=True)
class Marker(Positional):
    """[job, epoch, sender]: the sender's last message under the epoch before `epoch`."""

    TYPE: ClassVar[str] = "marker"
    job: int = _req(_INT)
    epoch: int = _req(_INT)
    sender: str = _req(_STR)


@dataclass(frozen=True, slots=True)
class Migrate(Marker):
    """[job, epoch, sender, units, rows, more]: key groups and requests changing owner (`check_migrate`
    checks them against the job's operators); the sender's last one has `more` false."""

    TYPE: ClassVar[str] = "migrate"
    units: list = _req(_LIST)  # [op, key group, msgpack blob of {key: state}, its key count, rows of that group]
    rows: list = _req(_LIST)
    more: bool = _req(_BOOL)


MESSAGES: dict[str, type[Message]] = {cls.TYPE: cls for cls in (
    Submit, Push, WaitIdle, StateRequest, Collected, Stats, Cancel, Stop, EndInput, Jobs, Workers, Scale, Place,
    Autoscale, Drain, Pool, Register, Leave, Heartbeat, Reply, Error,
    Deploy, Restore, MigratePlan, Peers, StopJob, Counters, StateDump, StatePacked, CollectedDump, StateGet, StatePut,
    CkptBegin, CkptSnapshot, CkptAbort, SinkCommit, SinkFlush, SrcAssign, SrcRelease, RstateGetMany, RstatePutMany,
    Welcome, Shutdown, Credit, Leased, Watermark, Lease, ReadEnd, WmIdle, WmFired, WmOut, Marker, Migrate)}
for _mtype, _cls in MESSAGES.items():
    if issubclass(_cls, Positional):
        _POSITIONS[_mtype] = [(f.name, f.metadata["types"]) for f in fields(_cls)]
        _LIST_BODIES[_mtype] = len(_POSITIONS[_mtype])
        continue
    SCHEMAS[_mtype] = {f.name: f.metadata["types"] for f in fields(_cls) if not f.metadata.get("optional")}
    _opts = {f.name: f.metadata["types"] for f in fields(_cls) if f.metadata.get("optional")}
    if _opts:
        _OPTIONAL[_mtype] = _opts
TYPES = frozenset(SCHEMAS) | frozenset(_LIST_BODIES)

_packer = msgpack.Packer(use_bin_type=True)


def encode(mtype: str, body: Any) -> bytes:
    """One frame: msgpack [VERSION, mtype, body]."""
    return _packer.pack([VERSION, mtype, body])


def _ext(code: int, data: bytes, _new=tuple.__new__, _cls=msgpack.ExtType) -> msgpack.ExtType:
    # msgpack's own ExtType checks its two fields in Python, ~1 µs a pushed segment; the unpacker gives an int and
    # bytes already.
    return _new(_cls, (code, data))


def decode(frame: bytes) -> tuple[str, Any]:
    """Parse and validate one frame; returns (type, body) or raises ProtocolError."""
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=False, use_list=True, ext_hook=_ext)
    except Exception as e:  # msgpack raises several unrelated types for garbage
        raise ProtocolError("undecodable", f"{type(e).__name__}: {e}") from None
    if not isinstance(msg, list) or len(msg) != 3:
        raise ProtocolError("bad_envelope", "expected [version, type, body]")
    version, mtype, body = msg
    if version != VERSION:
        raise ProtocolError("bad_version", f"version {version!r}, this process speaks {VERSION}")
    if not isinstance(mtype, str) or mtype not in TYPES:
        raise ProtocolError("unknown_type", f"type {mtype!r}")
    n = _LIST_BODIES.get(mtype)
    if n is not None:
        if (not isinstance(body, list) or (len(body) != n and len(body) < _LIST_LONGER.get(mtype, math.inf))
                or type(body[0]) is not int):
            raise ProtocolError("bad_body", f"{mtype}: expected a list of {n} starting with the job id")
        kinds = _POSITIONS.get(mtype)
        if kinds is not None:
            for (name, types), v in zip(kinds, body, strict=True):
                if types is not None and type(v) not in types:
                    raise ProtocolError("bad_field", f"{mtype}.{name}: {type(v).__name__}")
        return mtype, body
    if not isinstance(body, dict):
        raise ProtocolError("bad_body", f"{mtype}: expected a map")
    try:
        for name, types in SCHEMAS[mtype].items():
            if name not in body:
                raise ProtocolError("missing_field", f"{mtype}: missing {name!r}")
            if types is not None and (type(body[name]) not in types):
                raise ProtocolError("bad_field", f"{mtype}.{name}: {type(body[name]).__name__}")
        for name, types in _OPTIONAL.get(mtype, {}).items():
            if name in body and types is not None and body[name] is not None and type(body[name]) not in types:
                raise ProtocolError("bad_field", f"{mtype}.{name}: {type(body[name]).__name__}")
    except ProtocolError as e:
        e.req = _request_id(body)
        raise
    return mtype, body


def _request_id(body: dict) -> int | None:
    req = body.get("req")
    return req if type(req) is int else None


def parse(mtype: str, body: Any) -> Any:
    """A decoded body as its typed message (`MESSAGES`), checked; other bodies as they are, except that
    a `done` body is checked here too. Raises ProtocolError."""
    cls = MESSAGES.get(mtype)
    if cls is None:
        if mtype == "done":
            check_progress(body)
        elif mtype == "seal":
            check_seal(body)
        elif mtype == "seals":
            check_seals(body)
        return body
    if issubclass(cls, Positional):
        msg = cls(*body)
        msg.check()
        return msg
    msg = cls(**{f.name: body.get(f.name) for f in fields(cls)})
    try:
        msg.check()
    except ProtocolError as e:
        e.req = _request_id(body)
        raise
    return msg


def decode_message(frame: bytes) -> tuple[str, Any]:
    """`decode` then `parse`: (type, typed message or list body); raises ProtocolError."""
    mtype, body = decode(frame)
    return mtype, parse(mtype, body)


def pack(msg: Message) -> bytes:
    """One frame holding a typed message."""
    return encode(msg.TYPE, msg.body())


def check_rows(rows: Any, n_ops: int) -> None:
    """Validate the rows [op, value, key, rid] of a data message before any is enqueued."""
    if type(rows) is not list:
        raise ProtocolError("bad_batch", "rows is not a list")
    if not rows:
        return
    if not set(map(type, rows)) <= {list} or set(map(len, rows)) != {4}:
        raise ProtocolError("bad_batch", "each row must be [op, value, key, rid]")
    ops = set(map(_first, rows))
    if not all(type(o) is int and 0 <= o < n_ops for o in ops):
        raise ProtocolError("bad_batch", f"operator index out of range 0..{n_ops - 1}")
    if not set(map(type, map(_rid, rows))) <= {int}:
        raise ProtocolError("bad_batch", "rids must be integers")
    if min(map(_rid, rows)) < 0:
        raise ProtocolError("bad_batch", "negative rid")


_first, _rid = itemgetter(0), itemgetter(3)


_RUN_VALUES = (list, bytes, msgpack.ExtType)  # a list, or a pushed segment (`open_runs`)


def check_runs(runs: Any, n_ops: int) -> None:
    """Validate the runs [op, first rid, values] of a runs message before any is enqueued."""
    if type(runs) is not list:
        raise ProtocolError("bad_batch", "runs is not a list")
    for r in runs:
        if (type(r) is not list or len(r) != 3 or type(r[0]) is not int or not 0 <= r[0] < n_ops
                or type(r[1]) is not int or r[1] < 0 or type(r[2]) not in _RUN_VALUES):
            raise ProtocolError("bad_batch", "each run must be [op, first rid, values]")


# ----------------------------------------------------------------- pushed segments
# A client packs a push as msgpack arrays of SEGMENT_RECORDS consecutive records. The planner checks their
# structure (`check_segments`: no object is built), logs the push frame as it came and sends each segment on
# as the values of one run, a bin the worker decodes (`open_runs`): the planner decodes and encodes no record.
# A dispatch is cut at segment boundaries, so the segment bounds how evenly a dispatch spreads over the
# source's workers: with whole pushes of 5,000 records or more, two workers get 2,500 ± 512 each. A segment is
# one progress epoch (`tracking.EPOCH_SIZE`; a chunk starts at an epoch): each worker runs whole epochs and
# its reports name each once, not the two a segment of 500 straddled (a third fewer entries a report).
#
# The client compresses a segment with lz4 where that saves at least a tenth (Word Count's lines: 1.7x): every
# pushed byte crosses the planner three times (CURVE's decryption, the input log's checksum, copy and sync,
# CURVE's encryption toward a worker), ~0.15 µs of the planner's CPU a line, while the compression costs the
# client about as much and the worker's decompression a sixth of it. A compressed segment is the msgpack
# extension SEG_LZ4: its record count and packed size (`SEG_LZ4_HEAD`), then the lz4 block. The planner reads
# the count from the head and cannot check the records without decompressing them: the worker does, and counts
# the segment's records as failed when the block does not decompress into an array of that many.
SEGMENT_RECORDS = 512
MAX_SEGMENTS = 4096  # per push
SEG_LZ4 = 1
SEG_LZ4_HEAD = struct.Struct(">II")  # records, bytes of the packed array
COMPRESS_GAIN = 0.9  # a segment goes compressed when that leaves at most this share of its bytes


def pack_segments(records: list, packb=msgpack.packb, compress: bool = True) -> list:
    """A push's records as its `segments` (bins, or SEG_LZ4 extensions where compressing pays)."""
    out = []
    for i in range(0, len(records), SEGMENT_RECORDS):
        part = records[i:i + SEGMENT_RECORDS]
        raw = packb(part)
        if compress:
            z = lz4.block.compress(raw, store_size=False)
            if len(z) <= COMPRESS_GAIN * len(raw):
                out.append(msgpack.ExtType(SEG_LZ4, SEG_LZ4_HEAD.pack(len(part), len(raw)) + z))
                continue
        out.append(raw)
    return out


def packed_size(frame_bytes: int, segments: list) -> int:
    """A push frame's bytes with each compressed segment counted at its packed size: what its records weigh
    in the queue's bounds and the client's chunks (`credit.charge`), as they did uncompressed. Counted
    compressed, a bound in bytes or the time bound's floor of 8 pushes held up to ~100 times more of records
    that compress well, and as long a wait in the queue."""
    return frame_bytes + sum(SEG_LZ4_HEAD.unpack_from(s.data)[1] - len(s.data) for s in segments
                             if type(s) is not bytes)


def array_header(seg: bytes) -> tuple[int, int]:
    """(length, header bytes) of the msgpack array `seg` starts with; (-1, 0) when it starts with none."""
    b = seg[0] if seg else -1
    if 0x90 <= b <= 0x9f:
        return b & 0x0f, 1
    if b == 0xdc and len(seg) >= 3:
        return int.from_bytes(seg[1:3], "big"), 3
    if b == 0xdd and len(seg) >= 5:
        return int.from_bytes(seg[1:5], "big"), 5
    return -1, 0


def array_count(seg: bytes) -> int:
    """The length of the msgpack array `seg` holds, read from its header; -1 when it does not start with one."""
    return array_header(seg)[0]


def segment_count(seg) -> int:
    """The records of a pushed segment (a packed array, or SEG_LZ4), read from its header; -1 if it has none."""
    if type(seg) is bytes:
        return array_count(seg)
    if type(seg) is msgpack.ExtType and seg.code == SEG_LZ4 and len(seg.data) > SEG_LZ4_HEAD.size:
        return SEG_LZ4_HEAD.unpack_from(seg.data)[0]
    return -1


def check_segments(segments: list, max_bytes: int = LIMITS.max_message) -> None:
    """Each segment is one whole msgpack array (its objects skipped over, none built), or SEG_LZ4 (its head
    read, its block not opened), with records, and all of them packed are at most `max_bytes` (a message's:
    a compressed push unpacks at a worker to no more than a plain one could hold); ProtocolError otherwise.
    Strings are not decoded here: a worker that cannot decode one counts the segment's records as failed
    (`open_runs`)."""
    if len(segments) > MAX_SEGMENTS:
        raise ProtocolError("bad_field", f"push.segments: {len(segments)}, at most {MAX_SEGMENTS}")
    packed = 0
    for seg in segments:
        if type(seg) is bytes and array_count(seg) > 0:
            _check_one_object(seg, "push.segments", "an array")
            packed += len(seg)
        elif segment_count(seg) > 0:
            packed += SEG_LZ4_HEAD.unpack_from(seg.data)[1]
        else:
            raise ProtocolError("bad_field", "push.segments: each must be a msgpack array of records, or one "
                                f"compressed (extension {SEG_LZ4})")
    if packed > max_bytes:
        raise ProtocolError("bad_field", f"push.segments: {packed} bytes unpacked, at most {max_bytes}")


def _check_one_object(data: bytes, what: str, kind: str) -> None:
    """`data` is one whole msgpack object (skipped over, none built); ProtocolError otherwise."""
    u = msgpack.Unpacker(max_buffer_size=len(data))
    u.feed(data)
    try:
        u.skip()
    except Exception as e:  # msgpack raises several unrelated types for garbage
        raise ProtocolError("bad_field", f"{what}: one is not msgpack: {type(e).__name__}") from None
    if u.tell() != len(data):
        raise ProtocolError("bad_field", f"{what}: one holds more than {kind}")


def segment_records(seg) -> list:
    """A checked segment's records (raises ValueError, or what msgpack or lz4 raise, on one that does not hold
    the records its head counts)."""
    if type(seg) is bytes:
        return msgpack.unpackb(seg, raw=False, strict_map_key=False)
    count, size = SEG_LZ4_HEAD.unpack_from(seg.data)
    out = msgpack.unpackb(lz4.block.decompress(memoryview(seg.data)[SEG_LZ4_HEAD.size:], uncompressed_size=size),
                          raw=False, strict_map_key=False)
    if type(out) is not list or len(out) != count:
        raise ValueError(f"not an array of the {count} records its head counts")
    return out


class Segments:
    """A push's records as its checked segments: `len` is the record count; `cut` takes whole segments."""

    __slots__ = ("parts", "counts", "n")

    def __init__(self, parts: list, counts: list[int] | None = None):
        self.parts = parts
        self.counts = counts if counts is not None else [segment_count(p) for p in parts]
        self.n = sum(self.counts)

    def __len__(self) -> int:
        return self.n

    def cut(self, offset: int, room: int) -> Segments | list:
        """The whole segments from record `offset` holding at most `room` records, and at least one; from an
        offset within a segment (a dispatch never leaves one there), the records decoded, as a list."""
        counts = self.counts
        i = at = 0
        while at < offset:
            at += counts[i]
            i += 1
        if at != offset:
            return self.decoded()[offset:offset + room]
        j, n = i, 0
        while j < len(counts) and (j == i or n + counts[j] <= room):
            n += counts[j]
            j += 1
        return Segments(self.parts[i:j], counts[i:j])

    def decoded(self) -> list:
        """Every record (raises what `segment_records` raises on a segment it cannot decode)."""
        return [r for p in self.parts for r in segment_records(p)]


def push_records(body: dict) -> list | Segments:
    """A push body's records: its list, or its segments (already checked)."""
    segments = body.get("segments")
    return body["records"] if segments is None else Segments(segments)


def open_runs(runs: list) -> list:
    """A runs message's runs whose values are a segment (bin or SEG_LZ4) with those decoded in place; returns
    the runs that cannot be, [op, first rid, records, error text] each, dropped from `runs`."""
    bad = []
    for i in range(len(runs) - 1, -1, -1):
        r = runs[i]
        v = r[2]
        if type(v) is not list:
            try:
                r[2] = segment_records(v)
                if type(r[2]) is not list:
                    raise ValueError("not an array")
            except Exception as e:
                bad.append([r[0], r[1], max(segment_count(v), 0), f"pushed segment not decodable: {e!r}"[:300]])
                del runs[i]
    return bad


def expand_run(op: int, first: int, values: list) -> zip:
    """The rows (op, value, key, rid) of one validated run, built without a Python-level loop."""
    return zip(repeat(op), values, repeat(None), range(first, first + len(values)))


def expand_runs(runs: list) -> list:
    """The rows [op, value, key, rid] of validated runs."""
    return [row for op, first, values in runs for row in expand_run(op, first, values)]


# A run of rows with one rid is sent once with its count when runs are at least this long on average: a
# line's words to one owner share it, a chain's single outputs do not.
MIN_RUN = 3


def columns(rows: list) -> list:
    """The groups of a `cols` message for rows (op, value, key, rid), one per operator in order of first
    appearance, rows of an operator in their order: [op, values, keys, rids, counts], keys None (every key
    None) or True (every key is its value) or one per row; counts None (one rid per row) or run lengths
    (rids[i] for counts[i] consecutive rows)."""
    ops, values, keys, rids = zip(*rows, strict=True)
    first = ops[0]
    if ops.count(first) == len(ops):
        return [_group(first, values, keys, rids)]
    by_op: dict[int, list] = {}
    for r in rows:
        by_op.setdefault(r[0], []).append(r)
    return [_group(op, *list(zip(*part, strict=True))[1:]) for op, part in by_op.items()]


def _group(op: int, values: tuple, keys: tuple, rids: tuple) -> list:
    n = len(values)
    if keys.count(None) == n:
        ks: Any = None
    elif all(map(is_, keys, values)):
        ks = True
    else:
        ks = list(keys)
    if len(set(rids)) * MIN_RUN <= n:
        rs, cs = [], []
        for rid, g in groupby(rids):
            rs.append(rid)
            cs.append(len(list(g)))
        return [op, list(values), ks, rs, cs]
    return [op, list(values), ks, list(rids), None]


# Slots of a worker's table of received strings (`open_columns`): a word each, most of a text's distinct words.
STRING_SLOTS = 1 << 16


def string_table() -> list:
    """An empty table of received strings for `open_columns`: a direct-mapped cache, one str a slot."""
    return [None] * STRING_SLOTS


def packed_values(values: list) -> list | bytes:
    """A group's values for the wire: with the kernels, a list of strings as one msgpack array (bin), which the
    receiver decodes in C, making each distinct string once (`open_columns`); anything else as it is."""
    if kernels.C is not None:
        packed = kernels.C.pack_strs(values)
        if packed is not None:
            return packed
    return values


def packed_ints(ints: list | None) -> list | bytes | None:
    """A group's record ids or run lengths for the wire: with the kernels, a list of non-negative ints as one
    msgpack array (bin) packed in C, which the receiver decodes in C (`open_columns`), where msgpack would make and
    read each int through its general loop; anything else as it is."""
    if kernels.C is not None and type(ints) is list:
        packed = kernels.C.pack_uints(ints)
        if packed is not None:
            return packed
    return ints


def encode_columns(job: int, epoch: int, groups: list) -> bytes:
    """A `cols` frame of `groups` (`columns`, or the keyed fast path's), each group's values `packed_values`, its
    record ids and run lengths `packed_ints`; the receiver calls `open_columns`, then `check_columns`."""
    return encode("cols", [job, epoch, [[g[0], packed_values(g[1]), g[2], packed_ints(g[3]), packed_ints(g[4]),
                                         *g[5:]] for g in groups]])


def open_columns(groups: Any, table: list) -> None:
    """The groups of a `cols` message whose values, record ids or run lengths came packed (`packed_values`,
    `packed_ints`) with those decoded in place, before `check_columns`: with the kernels, strings found in
    `table` (`string_table`) are its objects and the others join it; else, or when an array holds anything
    else, as msgpack decodes it. Raises ProtocolError for a packed array that does not decode to a list."""
    if type(groups) is not list:
        return
    C = kernels.C
    for g in groups:
        if type(g) is not list:
            continue
        for i in (1, 3, 4):
            if len(g) <= i or type(g[i]) is not bytes:
                continue
            items = None if C is None else C.unpack_strs(g[i], table) if i == 1 else C.unpack_uints(g[i])
            if items is None:
                try:
                    items = msgpack.unpackb(g[i], raw=False, strict_map_key=False)
                except Exception as e:
                    raise ProtocolError("undecodable", f"packed values: {type(e).__name__}: {e}"[:300]) from None
                if type(items) is not list:
                    raise ProtocolError("bad_batch", "packed values must be an array")
            g[i] = items


def check_columns(groups: Any, n_ops: int, n_groups: int = 128) -> None:
    """Validate the groups of a `cols` message before any row is enqueued."""
    if type(groups) is not list:
        raise ProtocolError("bad_batch", "groups is not a list")
    for g in groups:
        if type(g) is not list or len(g) not in (5, 6):
            raise ProtocolError("bad_batch", "each group must be [op, values, keys, rids, counts(, key groups)]")
        op, values, keys, rids, counts = g[:5]
        if len(g) == 6 and g[5] is not None and not (
                keys is True and type(g[5]) in (bytes, list) and len(g[5]) == len(values)
                and _in_range(g[5], n_groups)):
            raise ProtocolError("bad_batch", f"key groups must be one per value in 0..{n_groups - 1}, keys the values")
        if type(op) is not int or not 0 <= op < n_ops:
            raise ProtocolError("bad_batch", f"operator index out of range 0..{n_ops - 1}")
        if type(values) is not list or type(rids) is not list:
            raise ProtocolError("bad_batch", "values and rids must be lists")
        if not (keys is None or keys is True or (type(keys) is list and len(keys) == len(values))):
            raise ProtocolError("bad_batch", "keys must be None, true or one per value")
        fault = (kernels.C.runs_fault(rids, counts, len(values))
                 if kernels.C is not None and (counts is None or type(counts) is list)
                 else runs_fault(rids, counts, len(values)))
        if fault:
            raise ProtocolError("bad_batch", RUNS_FAULTS[fault])


# What `runs_fault` finds wrong with a group's record ids and run lengths, by its answer.
RUNS_FAULTS = {1: "rids must be integers", 2: "negative rid", 3: "one rid per value",
               4: "counts must be positive run lengths, one per rid, summing to the values"}


def runs_fault(rids: list, counts: Any, n: int) -> int:
    """0 when `rids` and `counts` describe `n` values as runs of record ids (`columns`), else the first of
    `RUNS_FAULTS` that fails, checked in its order (the kernels' `runs_fault`, in C, gives the same)."""
    if not set(map(type, rids)) <= {int}:
        return 1
    if rids and min(rids) < 0:
        return 2
    if counts is None:
        return 0 if len(rids) == n else 3
    if (type(counts) is not list or len(counts) != len(rids) or not set(map(type, counts)) <= {int}
            or (counts and min(counts) < 1) or sum(counts) != n):
        return 4
    return 0


def _in_range(ints: list | bytes, n: int) -> bool:
    """Whether every item is an int in 0..n-1 (n ≤ 256): bytes() refusing anything else, then nothing left
    once the bytes below n are deleted (a pass in C without an int object per item)."""
    try:
        b = ints if type(ints) is bytes else bytes(ints)
    except (TypeError, ValueError):
        return False
    return not b.translate(None, bytes(range(n)))


def column_rows(group: list):
    """The rows (op, value, key, rid) of one validated group, as an iterator (no loop in Python)."""
    op, values, keys, rids, counts = group[:5]
    if counts is not None:
        rids = chain.from_iterable(map(repeat, rids, counts))
    ks = values if keys is True else (repeat(None) if keys is None else keys)
    return zip(repeat(op), values, ks, rids, strict=False)  # repeat() is endless; the check counted


def expand_columns(groups: list) -> list:
    """Every row of validated groups, as a list."""
    return list(chain.from_iterable(map(column_rows, groups)))


def column_count(groups: list) -> int:
    return sum(len(g[1]) for g in groups)


def check_migrate(body: list, n_ops: int, n_groups: int = 128) -> None:
    """Validate [job, epoch, sender, units, rows, more] (or a marker's first three); a unit is
    [op, key group, msgpack blob of {key: state}, its key count, rows of that group] (the blob is decoded
    where it is first used, and checked there)."""
    if type(body[1]) is not int or type(body[2]) is not str:
        raise ProtocolError("bad_body", "expected [job, epoch, sender, ...]")
    if len(body) == 6:
        units, rows, more = body[3], body[4], body[5]
        if type(units) is not list or type(more) is not bool:
            raise ProtocolError("bad_body", "migrate: expected [job, epoch, sender, units, rows, more]")
        for u in units:
            if (type(u) is not list or len(u) != 5 or type(u[0]) is not int or not 0 <= u[0] < n_ops
                    or type(u[1]) is not int or not 0 <= u[1] < n_groups or type(u[2]) is not bytes
                    or type(u[3]) is not int or u[3] < 0):
                raise ProtocolError("bad_body", "migrate: a unit must be [op, key group, state blob, keys, rows]")
            check_rows(u[4], n_ops)
        check_rows(rows, n_ops)


def check_progress(body: list) -> None:
    """Validate a done message body [job, {progress epoch: {op: requests produced minus finished}}, behind]
    (`behind`: the worker's queued work past its push roots, in root requests; `JobEngine.behind`)."""
    progress = body[1]
    if type(progress) is not dict or len(body) > 2 and (type(body[2]) is not int or body[2] < 0):
        raise ProtocolError("bad_body", "done: expected [job, {epoch: {op: delta}}, behind]")
    for e, d in progress.items():  # a few epochs of two or three operators: plain loops beat building sets
        if type(e) is not int or type(d) is not dict:
            raise ProtocolError("bad_body", "done: epochs must be integers, each with {op: delta}")
        for op, delta in d.items():
            if type(op) is not int or type(delta) is not int:
                raise ProtocolError("bad_body", "done: operators and deltas must be integers")


def check_seal(body: list) -> None:
    """Validate a seal [job, chunk, records, {epoch: {op: requests}}] or, from partitions on event time,
    [..., [source operator, partition, watermark after the chunk], ...]: a mark for each partition whose records
    the chunk holds (several when a worker's reading is aligned in event time, `clasp.core.alignment`)."""
    if type(body[1]) is not int or type(body[2]) is not int or body[1] < 0 or body[2] <= 0:
        raise ProtocolError("bad_body", "seal: expected [job, chunk, records, counts]")
    for mark in body[4:]:
        if type(mark) is not list or len(mark) != 3 or type(mark[2]) not in (int, float):
            raise ProtocolError("bad_body", "seal: a mark must be [source operator, partition, time]")
    check_progress([body[0], body[3]])


def check_seals(body: list) -> None:
    """Validate seals [job, [[chunk, records, counts, mark...], ...]] (each as `check_seal` has it)."""
    if type(body[1]) is not list or not body[1]:
        raise ProtocolError("bad_body", "seals: expected [job, [seal, ...]]")
    for seal in body[1]:
        if type(seal) is not list or len(seal) < 3:
            raise ProtocolError("bad_body", "seals: each seal is [chunk, records, counts, mark...]")
        check_seal([body[0], *seal])


def reply(req: int, result: Any = None) -> bytes:
    if type(result) is Packed:  # "result" is the map's last key: its value, packed as nil, is the frame's last byte
        return encode("reply", {"req": req, "ok": True, "result": None})[:-1] + result
    return encode("reply", {"req": req, "ok": True, "result": result})


class Packed(bytes):
    """One msgpack object, encoded already: `reply` puts it in its frame as it is."""

    __slots__ = ()


def map_header(data: bytes) -> tuple[int, int]:
    """(entries, header bytes) of the msgpack map `data` starts with; ProtocolError when it starts with none."""
    b = data[0] if data else -1
    if 0x80 <= b <= 0x8f:
        return b & 0x0f, 1
    if b == 0xde and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if b == 0xdf and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    raise ProtocolError("bad_field", "expected a packed msgpack map")


def splice_maps(parts: list) -> Packed:
    """One msgpack map holding the entries of every part (each a packed map, checked to be exactly one
    object), in order: decoded, it is the parts' dicts merged by `update` in that order."""
    n, bodies = 0, []
    for p in parts:
        if type(p) is not bytes:
            raise ProtocolError("bad_field", "expected a packed msgpack map")
        count, head = map_header(p)
        _check_one_object(p, "packed maps", "a map")
        n += count
        bodies.append(memoryview(p)[head:])
    return Packed(map_head(n) + b"".join(bodies))


def map_head(n: int) -> bytes:
    """The msgpack header of a map of `n` entries."""
    return _head(n, 0x80, b"\xde", b"\xdf")


def _head(n: int, fix: int, b16: bytes, b32: bytes) -> bytes:
    if n <= 0x0f:
        return bytes([fix | n])
    return b16 + n.to_bytes(2, "big") if n <= 0xffff else b32 + n.to_bytes(4, "big")


def check_packed_array(data: Any, what: str) -> None:
    """`data` is bytes holding one whole msgpack array (its items skipped over, none built); ProtocolError
    otherwise."""
    if type(data) is not bytes or array_count(data) < 0:
        raise ProtocolError("bad_field", f"{what}: expected a packed msgpack array")
    _check_one_object(data, what, "an array")


def splice_arrays(parts: Sequence[bytes]) -> Packed:
    """One msgpack array holding the items of every part (each a packed array `check_packed_array` passed),
    in order: decoded, it is the parts' lists concatenated. No item is read, each is copied once."""
    return Packed(b"".join(array_pieces(parts)))


def array_pieces(parts: Sequence[bytes]) -> list:
    """`splice_arrays`'s array as the pieces to write one after the other (a header, then views of the parts)."""
    n, bodies = 0, []
    for p in parts:
        count, head = array_header(p)
        if count < 0:
            raise ProtocolError("bad_field", "expected a packed msgpack array")
        n += count
        bodies.append(memoryview(p)[head:])
    return [_head(n, 0x90, b"\xdc", b"\xdd"), *bodies]


def reply_error(req: int, error: str) -> bytes:
    return encode("reply", {"req": req, "ok": False, "error": error})


def error(reason: str, detail: str) -> bytes:
    return encode("error", {"reason": reason, "detail": detail[:500]})
