"""The planner's rule for a stage of windows fed by another (`FiredChunks`, `follow_stages`, docs/TIME.md): the
second stage's watermark passes the first's only once every worker answered the round and every chunk of windows
the first fired is sealed and complete, whatever the order in which the planner takes the workers' messages and
looks between them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core.eventtime import NEG_INF
from clasp.core.timed import FiredChunks, follow_stages

W1 = 10.0  # the first stage's watermark, moved in round 1; the second stage is still below


class Planner:
    """The planner's side of one round: the tracker's open chunks (a chunk opens at its seal, closes when
    complete), the workers' answers, the fired chunks, and a look (`tick`) at any moment."""

    def __init__(self, workers: int):
        self.open: set[int] = set()
        self.answered = dict.fromkeys(range(workers), 0)
        self.fired = FiredChunks()
        self.levels, self.rounds = [W1, NEG_INF], [1, 0]

    def take(self, worker: int, msg: tuple) -> None:
        kind, arg = msg
        if kind == "wm_out":
            self.fired.announced(arg)
        elif kind == "seal":
            self.open.add(arg)
            self.fired.sealed(arg)
        else:
            self.answered[worker] = arg

    def tick(self) -> None:
        self.fired.settle(self.open.__contains__)
        follow_stages(self.levels, self.rounds, min(self.answered.values()), bool(self.fired), 2)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=3), st.data())
def test_the_second_stage_waits_for_every_fired_chunk_in_any_interleaving(fires, data):
    """Each worker that fired windows sends `wm_out`, the chunk's seal and `wm_fired`, in that order on its
    channel; the chunk completes some time after its seal; the planner looks at any point. The second stage's
    watermark moves only once every chunk is complete, and it does move once they are."""
    p = Planner(len(fires))
    queues = {w: ([("wm_out", w), ("seal", w)] if fired else []) + [("wm_fired", 1)] for w, fired in enumerate(fires)}
    sealed: set[int] = set()
    complete: set[int] = set()
    while any(queues.values()) or sealed - complete:
        steps = [("msg", w) for w, q in queues.items() if q] + [("done", c) for c in sorted(sealed - complete)]
        kind, who = data.draw(st.sampled_from(steps + [("tick", None)]))
        if kind == "msg":
            msg = queues[who].pop(0)
            p.take(who, msg)
            if msg[0] == "seal":
                sealed.add(who)
        elif kind == "done":
            complete.add(who)
            p.open.discard(who)
        else:
            p.tick()
            fired_chunks = {w for w, f in enumerate(fires) if f}
            if p.levels[1] == W1:
                assert fired_chunks <= complete, "the second stage passed windows still on their way"
    p.tick()
    assert p.levels == [W1, W1] and p.rounds[1] == 2


def test_a_chunk_announced_and_not_sealed_yet_is_on_its_way():
    """The interleaving that sent windows to the late output under load: the planner looks after a worker's
    `wm_out` and before the seal behind it, when the chunk is not open in its tracker yet."""
    p = Planner(1)
    p.take(0, ("wm_out", 7))
    p.tick()
    p.take(0, ("seal", 7))
    p.take(0, ("wm_fired", 1))
    p.tick()
    assert p.levels[1] == NEG_INF
    p.open.discard(7)  # processed by the second stage
    p.tick()
    assert p.levels[1] == W1


def test_a_stage_waits_for_every_worker_to_answer_the_round_in_which_the_one_before_moved():
    levels, rounds = [W1, NEG_INF, NEG_INF], [3, 1, 1]
    assert not follow_stages(levels, rounds, 2, False, 4)
    assert levels == [W1, NEG_INF, NEG_INF]
    assert follow_stages(levels, rounds, 3, False, 4)
    assert levels == [W1, W1, NEG_INF] and rounds == [3, 4, 1]  # the third follows the second's own round
    assert not follow_stages(levels, rounds, 3, False, 5)
    assert follow_stages(levels, rounds, 4, False, 5) and levels == [W1, W1, W1]
    levels = [W1, NEG_INF]
    assert not follow_stages(levels, [1, 0], 5, True, 6)  # a fired chunk still open
