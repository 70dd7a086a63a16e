"""Nexmark in one process, before the runtime runs it: each query's CPU per event as plain Python (the reference),
as clasp's stages of windows, joins and timers (`clasp.apps.nexmark.run`), and as a Bytewax 0.21 dataflow on one
worker (`bytewax.testing.run_main`), on the same generated events, every answer checked against the reference.

`python -m clasp.bench.nexmark [--events N] [--batch B] [--queries q0,q5,...] [--json FILE]` (Bytewax
from `pip install '.[peers]'`, skipped without it). Both systems get the events in batches of B (clasp's
watermark moves after each batch, Bytewax's source yields B per batch) and the clock is the process's CPU time
(`time.process_time`), from before the first event to the last answer; event generation is outside it. No
sockets and no serialization on either side: this is the operators' own cost, not the runtime's throughput.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time

from clasp.apps import nexmark as nx


def _cpu(fn) -> tuple[float, object]:
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def measure(events: list[dict], query: str, batch: int, bytewax: bool) -> dict:
    n = len(events)
    want = nx.QUERIES[query](events)
    t_ref, _ = _cpu(lambda: nx.QUERIES[query](events))
    t_clasp, (out, late) = _cpu(lambda: nx.run(nx.STAGES[query](), events, 0, batch))
    row = {"query": query, "events": n, "answers": len(want),
           "reference_events_per_s": round(n / t_ref), "clasp_events_per_s": round(n / t_clasp),
           "clasp_exact": nx.answer(query, out) == want and late == 0}
    if bytewax:
        from bytewax.testing import TestingSink, TestingSource, run_main

        from clasp.bench.peers import nexmark_bytewax as bw

        rows: list = []
        # Q8's clock waits out a batch's span of event time (a merge may reorder within it): 10 events per ms.
        bound = batch // 10 + 1
        flow = bw.build(query, TestingSource(events, batch_size=batch), TestingSink(rows), bound)
        t_bw, _ = _cpu(lambda: run_main(flow))
        row.update(bytewax_events_per_s=round(n / t_bw), bytewax_exact=bw.answer(query, rows) == want,
                   clasp_over_bytewax=round(t_bw / t_clasp, 2))
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--queries", default=",".join(nx.QUERIES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args(argv)
    events = nx.generate(a.events, a.seed)
    bytewax = importlib.util.find_spec("bytewax") is not None
    rows = [measure(events, q, a.batch, bytewax) for q in a.queries.split(",")]
    for r in rows:
        print(json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["clasp_exact"] and r.get("bytewax_exact", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
