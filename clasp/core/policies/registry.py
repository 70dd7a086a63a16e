"""Every policy by the name `--policy` accepts: CLASP, its paper variant and the baselines.

A module of its own above the policies, so that none of them imports another to register itself (the
base, CLASP and the baselines used to import each other).
"""

from __future__ import annotations

from clasp.core.policies.base import Policy
from clasp.core.policies.baselines import BASELINES
from clasp.core.policies.clasp import ClaspPaperPolicy, ClaspPolicy

POLICIES: dict[str, type[Policy]] = {"clasp": ClaspPolicy, "clasp-paper": ClaspPaperPolicy, **BASELINES}
