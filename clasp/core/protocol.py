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
| data | P/W → W | [job, epoch, rows]: requests, each row [op, value, key, rid, weight] |
| runs | P → W | [job, epoch, runs]: records for stateless sources, each run [op, first rid, weight, values] |
| done | W → P | [job, {rid: weight}, extends] — weight returned by finished requests (termination detection) |
| extend_ack | P → W | [job, token] — the planner has added weight, parked children may go |
| migrate_plan | P → W | req, job, plan, placement; the reply comes when the worker is done |
| marker | P/W → W | [job, epoch, sender]: the sender's last message under the previous epoch |
| migrate | W → W | [job, epoch, sender, units, rows, more]: key groups and requests changing owner |
| scale, place, autoscale | C → P | req, job, workers / placement {op: {worker index: share}} / enabled |
| submit, push, wait_idle, state, collected, stats, cancel, jobs, workers | C → P | req plus the call's fields |
| state_get, state_put, state_dump, collected_dump, counters, stop_job | P/any → W | req plus fields |
| rstate_get_many | W → P state server | req, job, op, keys — reply {key: state} for the keys that have one |
| rstate_put_many | W → P state server | req, job, op, states {key: state, None deletes} — reply true |
| reply | any → requester | req, ok, result or error |
| error | any → sender of a bad message | reason, detail |

`deploy` has two optional fields: `state` is "local" or "remote" (then `state_server` is the planner's remote-state
endpoint, which serves `rstate_get_many` and `rstate_put_many`: `clasp/runtime/state_server.py`).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import msgpack

VERSION = 1

# Weight of one input record for termination detection (weight throwing): lcm(1..40) * 1024, so a
# record splits exactly into up to 40 children several levels deep and fits an unsigned 64-bit int.
ROOT_WEIGHT = 5342931457063200 * 1024


class ProtocolError(ValueError):
    """A frame that is not a valid clasp message; `reason` is a short label for metrics."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


_STR, _INT, _NUM, _BYTES, _DICT, _LIST, _BOOL = (str,), (int,), (int, float), (bytes,), (dict,), (list,), (bool,)
_ANY = None

# Required fields of the map-bodied messages and their accepted types; optional fields are in _OPTIONAL.
SCHEMAS: dict[str, dict[str, tuple | None]] = {
    "register": {"id": _STR, "host": _STR, "data": _STR, "state": _STR, "metrics": _STR, "p_max": _INT, "pid": _INT},
    "welcome": {"planner": _STR, "heartbeat": _NUM},
    "heartbeat": {"id": _STR, "sample": _DICT},
    "deploy": {"req": _INT, "job": _INT, "dag": _DICT, "placement": _DICT, "peers": _DICT},
    "submit": {"req": _INT, "dag": _DICT},
    "push": {"req": _INT, "job": _INT, "records": _LIST},
    "wait_idle": {"req": _INT, "job": _INT, "timeout": _NUM},
    "state": {"req": _INT, "job": _INT, "op": _STR},
    "collected": {"req": _INT, "job": _INT, "op": _STR},
    "stats": {"req": _INT, "job": _INT},
    "cancel": {"req": _INT, "job": _INT},
    "jobs": {"req": _INT},
    "workers": {"req": _INT},
    "state_get": {"req": _INT, "job": _INT, "op": _STR, "key": _ANY},
    "state_put": {"req": _INT, "job": _INT, "op": _STR, "key": _ANY, "value": _ANY},
    "state_dump": {"req": _INT, "job": _INT, "op": _STR},
    "collected_dump": {"req": _INT, "job": _INT, "op": _STR},
    "stop_job": {"req": _INT, "job": _INT},
    "counters": {"req": _INT, "job": _INT},
    "migrate_plan": {"req": _INT, "job": _INT, "plan": _DICT, "placement": _DICT},
    "scale": {"req": _INT, "job": _INT, "workers": _INT},
    "place": {"req": _INT, "job": _INT, "placement": _DICT},
    "autoscale": {"req": _INT, "job": _INT, "enabled": _BOOL},
    "reply": {"req": _INT, "ok": _BOOL},
    "error": {"reason": _STR, "detail": _STR},
    "rstate_get_many": {"req": _INT, "job": _INT, "op": _STR, "keys": _LIST},
    "rstate_put_many": {"req": _INT, "job": _INT, "op": _STR, "states": _DICT},
}
_OPTIONAL: dict[str, dict[str, tuple | None]] = {
    "submit": {"placement": _DICT, "options": _DICT, "key_weights": _DICT},
    "stats": {"fresh": _BOOL},
    "counters": {"below": _INT},  # also answer `holds_below`: anything of a record below this id here
    "reply": {"result": _ANY, "error": _STR},
    "deploy": {"state": _STR, "state_server": _STR},
}
# List-bodied messages on the data path; the first element is always the job id.
_LIST_BODIES = {"data": 3, "runs": 3, "done": 3, "extend_ack": 2, "marker": 3, "migrate": 6}
TYPES = frozenset(SCHEMAS) | frozenset(_LIST_BODIES)

_packer = msgpack.Packer(use_bin_type=True)


def encode(mtype: str, body: Any) -> bytes:
    """One frame: msgpack [VERSION, mtype, body]."""
    return _packer.pack([VERSION, mtype, body])


def decode(frame: bytes) -> tuple[str, Any]:
    """Parse and validate one frame; returns (type, body) or raises ProtocolError."""
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=False, use_list=True)
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
        if not isinstance(body, list) or len(body) != n or type(body[0]) is not int:
            raise ProtocolError("bad_body", f"{mtype}: expected a list of {n} starting with the job id")
        return mtype, body
    if not isinstance(body, dict):
        raise ProtocolError("bad_body", f"{mtype}: expected a map")
    schema = SCHEMAS[mtype]
    for name, types in schema.items():
        if name not in body:
            raise ProtocolError("missing_field", f"{mtype}: missing {name!r}")
        if types is not None and (type(body[name]) not in types):
            raise ProtocolError("bad_field", f"{mtype}.{name}: {type(body[name]).__name__}")
    for name, types in _OPTIONAL.get(mtype, {}).items():
        if name in body and types is not None and body[name] is not None and type(body[name]) not in types:
            raise ProtocolError("bad_field", f"{mtype}.{name}: {type(body[name]).__name__}")
    return mtype, body


def check_rows(rows: Any, n_ops: int) -> None:
    """Validate the rows [op, value, key, rid, weight] of a data message before any is enqueued."""
    if type(rows) is not list:
        raise ProtocolError("bad_batch", "rows is not a list")
    if not rows:
        return
    if not set(map(type, rows)) <= {list} or set(map(len, rows)) != {5}:
        raise ProtocolError("bad_batch", "each row must be [op, value, key, rid, weight]")
    ops = set(map(_first, rows))
    if not all(type(o) is int and 0 <= o < n_ops for o in ops):
        raise ProtocolError("bad_batch", f"operator index out of range 0..{n_ops - 1}")
    if not set(map(type, map(_rid, rows))) <= {int} or not set(map(type, map(_weight, rows))) <= {int}:
        raise ProtocolError("bad_batch", "rids and weights must be integers")
    if min(map(_weight, rows)) < 0:
        raise ProtocolError("bad_batch", "negative weight")


_first, _rid, _weight = itemgetter(0), itemgetter(3), itemgetter(4)


def check_runs(runs: Any, n_ops: int) -> None:
    """Validate the runs [op, first rid, weight, values] of a runs message before any is enqueued."""
    if type(runs) is not list:
        raise ProtocolError("bad_batch", "runs is not a list")
    for r in runs:
        if (type(r) is not list or len(r) != 4 or type(r[0]) is not int or not 0 <= r[0] < n_ops
                or type(r[1]) is not int or r[1] < 0 or type(r[2]) is not int or r[2] < 0 or type(r[3]) is not list):
            raise ProtocolError("bad_batch", "each run must be [op, first rid, weight, values]")


def expand_runs(runs: list) -> list:
    """The rows [op, value, key, rid, weight] of validated runs."""
    return [(op, v, None, first + i, w) for op, first, w, values in runs for i, v in enumerate(values)]


def check_migrate(body: list, n_ops: int, n_groups: int = 128) -> None:
    """Validate [job, epoch, sender, units, rows, more] (or a marker's first three); a unit is
    [op, key group, {key: state}, rows of that group]."""
    if type(body[1]) is not int or type(body[2]) is not str:
        raise ProtocolError("bad_body", "expected [job, epoch, sender, ...]")
    if len(body) == 6:
        units, rows, more = body[3], body[4], body[5]
        if type(units) is not list or type(more) is not bool:
            raise ProtocolError("bad_body", "migrate: expected [job, epoch, sender, units, rows, more]")
        for u in units:
            if (type(u) is not list or len(u) != 4 or type(u[0]) is not int or not 0 <= u[0] < n_ops
                    or type(u[1]) is not int or not 0 <= u[1] < n_groups or type(u[2]) is not dict):
                raise ProtocolError("bad_body", "migrate: a unit must be [op, key group, {key: state}, rows]")
            check_rows(u[3], n_ops)
        check_rows(rows, n_ops)


def check_returns(body: list) -> None:
    """Validate a done message body [job, {rid: weight}, [[rid, amount, token], ...]]."""
    _, returns, extends = body
    if not isinstance(returns, dict) or not isinstance(extends, list):
        raise ProtocolError("bad_body", "done: expected [job, {rid: weight}, extends]")
    if not set(map(type, returns)) <= {int} or not set(map(type, returns.values())) <= {int}:
        raise ProtocolError("bad_body", "done: rids and weights must be integers")
    for e in extends:
        if type(e) is not list or len(e) != 3 or any(type(x) is not int for x in e):
            raise ProtocolError("bad_body", "done: extends must be [rid, amount, token] integers")


def reply(req: int, result: Any = None) -> bytes:
    return encode("reply", {"req": req, "ok": True, "result": result})


def reply_error(req: int, error: str) -> bytes:
    return encode("reply", {"req": req, "ok": False, "error": error})


def error(reason: str, detail: str) -> bytes:
    return encode("error", {"reason": reason, "detail": detail[:500]})
