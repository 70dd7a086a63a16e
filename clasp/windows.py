"""Event time, windows, joins and timers: the public names (docs/TIME.md).

The window kinds (`tumbling`, `sliding`, `session`), the keyed time operators (`WindowOperator`, `WindowJoin`,
`IntervalJoin`, `TimerOperator`), the driver that runs one over many keys (`KeyedDriver`), and the watermark of
a source partition and of an operator's inputs (`PartitionClock`, `InputWatermarks`). All of them are pure: no
clock is read, processing time is passed in.
"""

from clasp.core.eventtime import (
    DROPPED,
    LATE,
    NEG_INF,
    ON_TIME,
    POS_INF,
    InputWatermarks,
    PartitionClock,
    after,
    classify,
    combine,
)
from clasp.core.joins import LEFT, RIGHT, IntervalJoin, WindowJoin
from clasp.core.keyed import KeyedDriver, TimerContext, TimerOperator
from clasp.core.timed import result_time
from clasp.core.timers import EVENT, PROCESSING
from clasp.core.windows import Session, Sliding, Step, Tumbling, WindowOperator, session, sliding, tumbling

__all__ = [
    "DROPPED", "EVENT", "LATE", "LEFT", "NEG_INF", "ON_TIME", "POS_INF", "PROCESSING", "RIGHT",
    "InputWatermarks", "IntervalJoin", "KeyedDriver", "PartitionClock", "Session", "Sliding", "Step",
    "TimerContext", "TimerOperator", "Tumbling", "WindowJoin", "WindowOperator", "after", "classify", "combine",
    "result_time", "session", "sliding", "tumbling",
]
