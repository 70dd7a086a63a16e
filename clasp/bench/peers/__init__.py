"""A peer benchmark: Word Count on the same generated lines with clasp and with Bytewax (`python -m clasp.bench.peers`).

Bytewax is an optional extra (`pip install .[peers]`); the dataflow is `clasp/bench/peers/bytewax_flow.py`.
"""

import msgpack
import zmq


def send_answer(address: str, payload) -> None:
    """`payload` sent (msgpack, PUSH) to the benchmark's answer socket, delivered before this returns: a
    private context is terminated, which waits for the message to leave (the socket's linger applies at the
    context's termination; a message still queued when a process merely exits is not guaranteed to leave)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 30_000)
    sock.connect(address)
    sock.send(msgpack.packb(payload))
    sock.close()
    ctx.term()
