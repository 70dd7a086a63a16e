"""Scaling policies: the interface and its inputs and outputs (`base`), CLASP (`clasp`), the baselines
(`baselines`) and every policy by name (`registry.POLICIES`). The names most callers need, re-exported."""

from clasp.core.policies.base import (
    PROFILE_FIELDS,
    Decision,
    EdgeStats,
    OperatorStats,
    PlacementResult,
    Policy,
    Stats,
    StatsError,
    uniform_placement,
)
from clasp.core.policies.baselines import BASELINES
from clasp.core.policies.clasp import ClaspConfig, ClaspPaperPolicy, ClaspPolicy
from clasp.core.policies.registry import POLICIES

__all__ = ["BASELINES", "POLICIES", "PROFILE_FIELDS", "ClaspConfig", "ClaspPaperPolicy", "ClaspPolicy", "Decision",
           "EdgeStats", "OperatorStats", "PlacementResult", "Policy", "Stats", "StatsError", "uniform_placement"]
