"""Limits that hold even for an authenticated peer (pure: no sockets).

Authentication decides who may talk to a cluster; these bound what one message, one submitted DAG and
one client's queue may cost, so that a buggy or compromised client cannot exhaust a planner's memory.
Every refusal names the limit and its value, and is counted in `clasp_limit_rejections_total{limit}`.

The values can be changed per process with environment variables (read at import), e.g. for a job
whose DAG closes over a large model: `CLASP_MAX_MESSAGE_BYTES`, `CLASP_MAX_DAG_BYTES`,
`CLASP_MAX_FUNCTION_BYTES`, `CLASP_MAX_CLIENT_PENDING`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _env_int(name: str, default: int) -> int:
    try:
        v = int(os.environ.get(name, default))
    except ValueError:
        return default
    return v if v > 0 else default


@dataclass(frozen=True)
class Limits:
    # zmq.MAXMSGSIZE on every socket: libzmq drops a connection that sends a larger frame before the
    # frame is buffered, so the application never sees it (the sending client checks first, below).
    max_message: int = _env_int("CLASP_MAX_MESSAGE_BYTES", 256 << 20)
    max_dag: int = _env_int("CLASP_MAX_DAG_BYTES", 16 << 20)  # one `submit` message
    max_function: int = _env_int("CLASP_MAX_FUNCTION_BYTES", 8 << 20)  # the DAG's cloudpickled functions
    # Per client (ROUTER identity) at the planner: pushes accepted but not yet acknowledged (backpressure),
    # plus requests being served (state, stats, scale, ...) plus wait_idle calls waiting.
    client_pending: int = _env_int("CLASP_MAX_CLIENT_PENDING", 256)
    # ZeroMQ's receive queue per peer on the planner's ROUTER (messages): a peer that sends faster than
    # the planner reads is slowed by TCP instead of growing the planner's memory.
    router_rcvhwm: int = 10_000


LIMITS = Limits()


class LimitError(ValueError):
    """A message over a limit; `limit` labels the counter, the text says which limit and how to raise it."""

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def check_message(nbytes: int, what: str, limits: Limits = LIMITS) -> None:
    if nbytes > limits.max_message:
        raise LimitError("message_size", f"{what}: a message of {_mb(nbytes)} is over the maximum message size "
                                         f"({_mb(limits.max_message)}, CLASP_MAX_MESSAGE_BYTES)")


def check_dag(nbytes: int, functions: object, limits: Limits = LIMITS) -> None:
    """A submitted DAG: the whole message and its function payload."""
    if isinstance(functions, bytes | bytearray) and len(functions) > limits.max_function:
        raise LimitError("function_size", f"the DAG's functions pickle to {_mb(len(functions))}, over the maximum "
                                          f"function payload ({_mb(limits.max_function)}, CLASP_MAX_FUNCTION_BYTES): "
                                          "load large data inside the function instead of closing over it")
    if nbytes > limits.max_dag:
        raise LimitError("dag_size", f"the submitted DAG is {_mb(nbytes)}, over the maximum DAG size "
                                     f"({_mb(limits.max_dag)}, CLASP_MAX_DAG_BYTES)")


def check_client_pending(pending: int, limits: Limits = LIMITS) -> None:
    if pending >= limits.client_pending:
        raise LimitError("client_queue", f"this client has {pending} requests pending at the planner, the maximum "
                                         f"(CLASP_MAX_CLIENT_PENDING={limits.client_pending}): wait for their answers")
