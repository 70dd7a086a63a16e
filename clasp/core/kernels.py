"""The keyed fast path's C kernels (clasp/core/_kernels.c), or None where they are not built.

`pip install` compiles them when it can (setup.py; optional: a failed build leaves them out) and each caller
keeps a Python version with the same results, which runs when `C` is None: `tracking.epochs_of_runs`,
`clasp.runtime.batches.apply_block`, `gather_outputs` and `group_bytes`, the file reader's
`clasp.connectors.file_source._long_digits`, `protocol.runs_fault`, `alignment.merged` (aligned reading's
merge); `protocol.packed_values` and `packed_ints` send a list as it is and `protocol.open_columns` decodes a
packed one with msgpack. CLASP_NO_KERNELS=1 in the
environment runs the Python versions although the kernels are built (to compare the two)."""

from __future__ import annotations

import os

# Why `C.apply_block` stopped at a value: it leaves the value to Python, fn raised (the exception comes back),
# fn returned something other than a pair (the result comes back).
LEFT, RAISED, RETURNED = 0, 1, 2

try:
    from clasp.core import _kernels as C
except ImportError:  # not built: no compiler when clasp was installed, or a source checkout run as it is
    C = None

if os.environ.get("CLASP_NO_KERNELS"):
    C = None
