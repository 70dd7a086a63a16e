"""One client shared by threads: each thread calls it on its own connection (a ZeroMQ socket belongs to one
thread), replies reach the thread that asked, and connections of threads that ended are closed."""

from __future__ import annotations

import threading
from collections import Counter

import clasp
from clasp.apps import wc


def test_threads_push_and_ask_through_one_client_and_every_answer_is_theirs(cluster3):
    lines = wc.generate(60_000, seed=11)
    with clasp.connect(cluster3.planner) as client:
        job = client.submit(wc.build_dag(), autoscale=False)
        errors: list[BaseException] = []
        pushed = threading.Event()
        asked = Counter()

        def push(part):
            try:
                job.push(part)  # one Job handle, pushed to from two threads at once
            except BaseException as e:  # surfaced by the assertion below
                errors.append(e)

        def ask(name):
            try:
                while not pushed.is_set():
                    ids = {w["id"] for w in client.workers()}
                    assert ids and all(i.startswith("w") for i in ids), ids
                    stats = client.job(job.id).stats()
                    assert stats["lost"] == 0
                    asked[name] += 1
            except BaseException as e:
                errors.append(e)

        pushers = [threading.Thread(target=push, args=(lines[i::2],)) for i in range(2)]
        askers = [threading.Thread(target=ask, args=(f"a{i}",)) for i in range(2)]
        for t in pushers + askers:
            t.start()
        for t in pushers:
            t.join(timeout=120)
        pushed.set()
        for t in askers:
            t.join(timeout=60)
        assert not errors, errors
        assert min(asked.values()) >= 1, asked
        job.wait_idle(timeout=120)
        assert job.state("count") == wc.expected(lines)
        # Five threads called the client; four have ended: the next new thread's first call closes theirs.
        assert len(client._conns) == 5
        done = threading.Thread(target=client.jobs)
        done.start()
        done.join()
        assert len(client._conns) == 2  # this thread's and the one that just ended
        job.cancel()


def test_a_closed_client_refuses_a_new_threads_call(cluster1):
    client = clasp.connect(cluster1.planner)
    client.close()
    failed: list[BaseException] = []

    def call():
        try:
            client.workers()
        except clasp.ClaspError as e:
            failed.append(e)

    t = threading.Thread(target=call)
    t.start()
    t.join(timeout=10)
    call()  # and the thread that closed it
    assert len(failed) == 2 and all("closed" in str(e) for e in failed), failed
