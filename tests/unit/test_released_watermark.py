"""The planner's released watermark (clasp.core.timed.ReleasedWatermark) and the window as a stateful
operator's function (TimedFold): a partition's watermark counts only once every chunk it sealed up to it is
complete; idle partitions are left out, ended ones promise everything."""

from __future__ import annotations

import math

import clasp.windows as W
from clasp.core.timed import LATE_OUT, ON_TIME_OUT, ReleasedWatermark, TimedFold, pick


def test_a_watermark_waits_for_every_earlier_chunk_of_its_partition():
    m = ReleasedWatermark([("s", "a"), ("s", "b")])
    m.sealed(("s", "a"), 1, 5.0)
    m.sealed(("s", "a"), 3, 9.0)
    m.sealed(("s", "b"), 2, 7.0)
    open_ = {1, 2, 3}
    m.settle(open_.__contains__)
    assert m.combined() == -math.inf
    open_ -= {3, 2}  # chunk 3 completed before chunk 1: a's watermark still waits for chunk 1
    m.settle(open_.__contains__)
    assert m.safe == {("s", "a"): -math.inf, ("s", "b"): 7.0} and m.combined() == -math.inf
    open_.clear()
    m.settle(open_.__contains__)
    assert m.combined() == 7.0  # the minimum over the partitions


def test_idle_partitions_are_left_out_and_ended_ones_promise_everything():
    m = ReleasedWatermark([("s", "a"), ("s", "b")])
    m.sealed(("s", "a"), 1, 4.0)
    m.settle(lambda c: False)
    assert m.combined() == -math.inf  # b has said nothing yet
    m.set_idle(("s", "b"), True)
    m.released = m.combined()
    assert m.released == 4.0
    m.sealed(("s", "b"), 2, 1.0)  # b resumes behind it: not idle any more
    assert ("s", "b") not in m.idle and m.combined() == 4.0  # never back
    m.settle(lambda c: c == 2)
    assert m.combined(ended=[("s", "a"), ("s", "b")]) == 4.0  # b's last chunk is still open
    m.settle(lambda c: False)
    assert m.combined(ended=[("s", "a"), ("s", "b")]) == math.inf
    m.reset()
    assert m.combined() == -math.inf and m.released == -math.inf


def test_timed_fold_tags_outputs_and_fires_due_keys():
    fold = TimedFold(W.WindowOperator(W.tumbling(10), lambda a, v: a + v[1], lambda: 0), lambda v: v[0],
                     lambda v: v[2])
    states = {}
    for v in [["a", 1, 3.0], ["a", 2, 12.0], ["b", 5, 4.0]]:
        states[v[0]], out = fold(states.get(v[0]), v)
        assert out == []
    fired = {k: (s, out) for k, s, out in fold.fire(states, 10.0)}
    assert fired["a"][1] == [(ON_TIME_OUT, ["a", 0.0, 10.0, 1])]
    assert fired["b"] == (None, [(ON_TIME_OUT, ["b", 0.0, 10.0, 5])])
    states.update({k: s for k, (s, _) in fired.items()})
    states.pop("b")
    _, out = fold(states["a"], ["a", 7, 1.0])  # behind the watermark the fold fired at
    assert out == [(LATE_OUT, ["a", 1.0, ["a", 7, 1.0]])] and fold.late == 1
    assert pick(LATE_OUT)(out[0]) == [["a", 1.0, ["a", 7, 1.0]]] and pick(ON_TIME_OUT)(out[0]) is None


def test_run_local_fires_every_window_at_the_end_of_its_input():
    import random
    from collections import Counter

    import clasp
    from clasp.testing import IterableSource, run_local

    rng = random.Random(3)
    evs = [[f"k{rng.randrange(7)}", round(i * 0.01 - rng.uniform(0, 0.5), 3)] for i in range(3000)]
    dag = clasp.Dag("local-windows")
    src = dag.source("events", IterableSource(evs, partitions=2), timestamp=lambda e: e[1], max_out_of_order=0.5)
    win = dag.window("counts", W.tumbling(2), key=lambda e: e[0], fold=lambda a, e: a + 1, init=lambda: 0,
                     collect=True)
    src >> win
    job = run_local(dag)
    assert {(k, s): n for k, s, _, n in job.collected("counts")} == dict(Counter((k, t - t % 2) for k, t in evs))
    assert len(job.collected("counts")) == len({(k, t - t % 2) for k, t in evs})
