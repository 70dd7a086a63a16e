"""What a frame costs through pyzmq's asyncio API and without its futures (`clasp.runtime.net`).

`python -m clasp.bench.frames [--frames N] [--rounds R]`: one process, a PUSH and a PULL over loopback TCP
under uvloop, N frames of 200 bytes each way per run, four ways: sends and receives both through the
asyncio socket (`await recv`, `send` per frame: the runtime before `DirectSend` / `drained`), only the
send direct, only the receive drained, and both (what the data path does now). Prints the process CPU
per frame (both ends and libzmq's I/O thread) and the wall time per frame; the rounds alternate the order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import uvloop
import zmq
import zmq.asyncio

from clasp.runtime.net import DirectSend, drained

FRAME = b"x" * 200
WAYS = ("asyncio", "direct_send", "drained_recv", "both")


async def one(way: str, n: int) -> dict:
    ctx = zmq.asyncio.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.connect(f"tcp://127.0.0.1:{port}")
    await asyncio.sleep(0.2)  # connected before the clock starts
    direct = DirectSend(push)
    raw = zmq.Socket.shadow(pull.underlying)
    send = direct.send if way in ("direct_send", "both") else push.send
    drain = way in ("drained_recv", "both")
    got = 0

    async def reader():
        nonlocal got
        while got < n:
            await pull.recv(copy=False)
            got += 1
            if drain:
                got += len(drained(raw, n - got))

    task = asyncio.ensure_future(reader())
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        send(FRAME, copy=False)
        if i % 100 == 99:
            await asyncio.sleep(0)  # the receiver runs between bursts, as a worker's loop turns
    await task
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    push.close(0)
    pull.close(0)
    ctx.term()
    return {"way": way, "cpu_us_per_frame": round(cpu / n * 1e6, 2), "wall_us_per_frame": round(wall / n * 1e6, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clasp.bench.frames", description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    runs = []
    for rnd in range(args.rounds):
        for way in (WAYS if rnd % 2 == 0 else WAYS[::-1]):
            r = uvloop.run(one(way, args.frames))
            runs.append(r)
            print(json.dumps(r), flush=True)
    med = {w: statistics.median(r["cpu_us_per_frame"] for r in runs if r["way"] == w) for w in WAYS}
    print(json.dumps({"median_cpu_us_per_frame": med,
                      "asyncio_over_both": round(med["asyncio"] / med["both"], 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
