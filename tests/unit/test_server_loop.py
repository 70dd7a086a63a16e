"""The draining server loop (`clasp.runtime.net.ServerLoop` with `drain=True`, the planner's): every queued
message taken per wake-up with no future each, answers sent at once through `post`, bad messages counted and
answered, and a message whose wake-up a send took is still served. Real ZeroMQ sockets in this process."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from clasp.core.protocol import ProtocolError
from clasp.runtime.net import ServerLoop


def _decode(frame) -> tuple[str, bytes]:
    data = bytes(frame)
    if data.startswith(b"bad"):
        raise ProtocolError("bad_frame", "starts with bad")
    return data.split(b":", 1)[0].decode(), data


@pytest.fixture
async def served():
    """A ROUTER served by a draining loop (handlers `echo` and `count`), and a DEALER connected to it."""
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, 0)
    router.bind("inproc://served")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"client")
    dealer.connect("inproc://served")
    seen: list[bytes] = []
    bad: list[ProtocolError] = []

    def count(ident, body):
        seen.append(body)

    loop = ServerLoop(router, {"echo": lambda ident, body: b"re " + body, "count": count}, where="a test",
                      on_bad=bad.append, on_failure=lambda *a: None, decode=_decode, drain=True)
    task = asyncio.ensure_future(loop.serve())
    try:
        yield loop, dealer, seen, bad
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        ctx.destroy(linger=0)


async def test_a_burst_is_served_in_order_and_answered(served):
    loop, dealer, seen, _ = served
    for i in range(300):  # more than one drain's worth, sent before the loop runs once
        dealer.send(b"count:%d" % i)
    for i in range(3):
        dealer.send(b"echo:%d" % i)
    answers = [await asyncio.wait_for(dealer.recv(), 5) for _ in range(3)]
    assert answers == [b"re echo:0", b"re echo:1", b"re echo:2"]
    assert seen == [b"count:%d" % i for i in range(300)]


async def test_a_bad_message_is_counted_and_answered_with_an_error(served):
    _, dealer, _, bad = served
    await dealer.send(b"bad one")
    answer = await asyncio.wait_for(dealer.recv(), 5)
    assert b"bad_frame" in answer and [e.reason for e in bad] == ["bad_frame"]
    await dealer.send(b"nope:1")  # a type nobody serves
    assert b"unexpected_type" in await asyncio.wait_for(dealer.recv(), 5)
    assert [e.reason for e in bad] == ["bad_frame", "unexpected_type"]


async def test_a_send_that_takes_the_wake_up_of_a_message_does_not_leave_it_unserved(served):
    loop, dealer, seen, _ = served
    await dealer.send(b"echo:first")
    assert await asyncio.wait_for(dealer.recv(), 5) == b"re echo:first"
    await asyncio.sleep(0.01)  # the loop waits on the socket's descriptor now
    for i in range(50):
        # The message lands in the ROUTER's pipe (inproc: at once) and its wake-up is pending; a send on the
        # ROUTER before the loop runs processes it, and libzmq's edge-triggered descriptor says nothing more.
        dealer.send(b"count:%d" % i)
        loop.post(b"client", b"pushed:%d" % i)
        await asyncio.sleep(0)
    for i in range(50):
        assert await asyncio.wait_for(dealer.recv(), 5) == b"pushed:%d" % i
    for _ in range(100):
        if len(seen) == 50:
            break
        await asyncio.sleep(0.01)
    assert seen == [b"count:%d" % i for i in range(50)]


async def test_a_post_to_a_peer_that_is_gone_is_dropped(served):
    loop, dealer, _, _ = served
    loop.post(b"nobody", b"lost")  # ROUTER_MANDATORY: EHOSTUNREACH, not an exception out of post
    await dealer.send(b"echo:still")
    assert await asyncio.wait_for(dealer.recv(), 5) == b"re echo:still"
