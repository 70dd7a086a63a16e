"""Drain time at 40,000 moved keys: two workers, a keyed count of 80,000 keys split evenly, `clasp drain w1`.

Run: .venv/bin/python -m clasp.bench.drain (docs/DEPLOY.md, "How long a drain takes")."""

import time

import clasp
from clasp.local.cluster import LocalCluster
from clasp.runtime.config import PlannerConfig


def main() -> None:
    config = PlannerConfig(autoscale=False, migration_timeout=60)
    with LocalCluster(workers=2, port=0, planner_config=config) as cl, clasp.connect(cl.planner) as c:
        dag = clasp.Dag("keys")
        src = dag.operator("src", lambda x: x)
        cnt = dag.operator("count", lambda s, x: ((s or 0) + 1, None), stateful=True, key=lambda x: x)
        src >> cnt
        job = c.submit(dag, placement={"src": {0: 0.5, 1: 0.5}, "count": {0: 0.5, 1: 0.5}}, autoscale=False)
        job.push([f"key-{i}" for i in range(80_000)])
        job.wait_idle(timeout=120)
        t = time.monotonic()
        r = c.drain("w1")
        wall = time.monotonic() - t
        assert len(job.state("count")) == 80_000
        m = job.stats()["migrations"][-1]
        print(r["detail"], f"(client wall {wall * 1e3:.0f} ms)",
              {k: m.get(k) for k in ("duration_s", "max_pause_s", "objects", "bytes")})


if __name__ == "__main__":
    main()
