"""The peers benchmarks wait for each Bytewax process's answer, and stop waiting as soon as the answer is known:
real child processes answering on a ZeroMQ PULL socket, failing, or exiting without a word."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import zmq

from clasp.bench.peers.__main__ import recv_answers

# The Bytewax sinks' own send, which terminates its context so that the answer leaves before the exit.
ANSWER = "import sys; from clasp.bench.peers import send_answer; send_answer(sys.argv[1], [int(sys.argv[2]), 'rows'])"


@pytest.fixture
def answers():
    sock = zmq.Context.instance().socket(zmq.PULL)
    end = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
    yield sock, end
    sock.close(linger=0)


def test_one_answer_per_process(answers):
    sock, end = answers
    procs = [subprocess.Popen([sys.executable, "-c", ANSWER, end, str(i)]) for i in range(2)]
    assert sorted(recv_answers(sock, procs, timeout=60)) == [[0, "rows"], [1, "rows"]]
    assert [p.wait(30) for p in procs] == [0, 0]


def test_a_process_that_fails_is_reported_at_once(answers):
    sock, _ = answers
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])]
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with code 3"):
        recv_answers(sock, procs, timeout=60)
    assert time.monotonic() - t0 < 10


def test_processes_gone_without_answering_are_reported_soon(answers):
    sock, end = answers
    procs = [subprocess.Popen([sys.executable, "-c", ANSWER, end, "0"]),
             subprocess.Popen([sys.executable, "-c", "pass"])]
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="1 answer\\(s\\) missing"):
        recv_answers(sock, procs, timeout=60)
    assert time.monotonic() - t0 < 15
