"""What an operator's return value means: the one rule the worker engine, `run_local` and the simulator share.

- `None` is no output.
- A `str`, `bytes`, `bytearray`, `dict`, any of their subclasses (a `StrEnum` member, a `Counter`,
  `OrderedDict` or `defaultdict`) and any other `collections.abc.Mapping` is one output.
- A `memoryview` is one output, converted to `bytes`: that is what msgpack makes of it between workers,
  and a view kept in a queue or a collect list would otherwise see later writes to its buffer.
- A value Python cannot iterate (int, float, bool, their subclasses, any other object) is one output.
- Any other iterable (list, tuple and their subclasses, generator, set, range, dict view, ...) is its items.

Pure: no asyncio, no sockets, so `clasp.testing` and the simulator import it without the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import GeneratorType
from typing import Any

# Exact types that are one output. The engine's hot loop tests `type(v) in ONE_EXACT` inline before it
# calls `as_outputs`, so the common returns cost one set lookup; subclasses are caught by `_ONE_BASES`.
ONE_EXACT = frozenset({str, bytes, bytearray, dict, int, float, bool})
# Exact iterable types that are their items, so a generator skips the isinstance checks below (the
# engine's hot loop tests it inline too).
ITEMS_EXACT = frozenset({GeneratorType, set, frozenset, range})
# Bases whose instances are one output (int and float are not iterable anyway; listing them skips the
# failed iter() below). Concrete classes first: isinstance stops at the first match, and the ABC check
# (any other Mapping) is the slowest.
_ONE_BASES = (str, bytes, bytearray, dict, int, float, Mapping)


def as_outputs(value: Any) -> list | tuple:
    """The outputs an operator's return value stands for (the module docstring states the rule)."""
    if value is None:
        return ()
    cls = type(value)
    if cls is list or cls is tuple:
        return value
    if cls in ONE_EXACT:
        return (value,)
    if cls in ITEMS_EXACT:
        return list(value)
    if cls is memoryview:  # memoryview cannot be subclassed
        return (value.tobytes(),)
    if isinstance(value, _ONE_BASES):
        return (value,)
    try:
        it = iter(value)
    except TypeError:  # not iterable: a scalar
        return (value,)
    # Outside the try: an error raised while iterating (a generator's body) is the operator's failure,
    # not a sign that the value is a scalar.
    return list(it)
