"""Nexmark, the streaming benchmark of online auctions: its seeded event generator (`generator`), its queries Q0-Q5,
Q7 and Q8 as plain Python in event time (`reference`, the exact answers), and the same queries as stages of
windows, joins and timers (`queries`, built from `clasp.windows`).
"""

from clasp.apps.nexmark.generator import Config, generate, max_out_of_order
from clasp.apps.nexmark.queries import QUERIES as STAGES
from clasp.apps.nexmark.queries import Stage, answer, run
from clasp.apps.nexmark.reference import QUERIES

NAME = "nexmark"
__all__ = ["NAME", "QUERIES", "STAGES", "Config", "Stage", "answer", "generate", "max_out_of_order", "run"]
