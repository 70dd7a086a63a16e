"""Calibrate the simulator's cost file from runs of the real runtime under a per-worker CPU quota.

`python -m clasp.bench.calibrate [--cpu-per-worker F] [--apps wc,syn,...] [--seconds S] [--repeat K]
[--out clasp/sim/sim_costs_measured.json]` runs, on local clusters whose workers are limited to F CPUs each
(`clasp.bench.cluster_engine`), and writes a file `clasp simulate APP --costs FILE` loads unchanged:

- **W** (capacity, µs of work per second): the quota's, F CPUs × 10⁶. Every quota-limited run's throughput is scaled
  to it by its busiest worker's CPU rate (/proc) over the steady window (`at_quota`): on a host shared with
  other work a worker gets less than its quota, run by run, and the fits below then read CPU per record, not
  the host's load (a quiet run's factor is ~1; the median CPU rate of the one-worker runs is reported).
- **α** (µs per local chained request) and **F** (µs per record of entering and leaving the runtime: the
  source's input from the planner, the sink's completion): SYN on one worker with ten operators and with
  SHORT_CHAIN (every chained request local). The per-record cost W / Λ that W and the measured throughput
  imply is Σ τ̄ + α·C + F for both, so α is the difference per chained request and F what is left:
  `α = ((W/Λ₁₀ − Σ τ̄₁₀) − (W/Λ₅ − Σ τ̄₅)) / (9 − 4)`, `F = W/Λ₁₀ − Σ τ̄₁₀ − 9α`. Half of F goes to the
  τ̄ of each app's source operators and half to its sinks' (per record), so a placement pays it where the
  source and the sink run; one chain length alone (`--no-short`) folds F into α:
  `α = (W / Λ₁₀ − Σ τ̄) / 9`.
- **β** (µs per remote chained request) and **γ** (µs/s per remote destination): two more SYN runs,
  (i) operators alternating between 2 workers (every chained request remote, δ = 1 on both) and (ii) even
  operators on worker 0, odd ones spread over workers 1 and 2 (every request remote, δ = 2 on worker 0);
  β and γ are the values with which the simulator reproduces both measured throughputs (solved by
  bisection, alternately). Neither placement is the spread that `clasp.bench.validate_sim` checks.
- **α_split** (µs per local chained request to a stateless successor that other workers also hold: the
  runtime's table route, `clasp/runtime/executor.py` `send`, instead of the single-holder fast path α is measured
  on): SYN with every operator nearly all on worker 0, its share there falling by 0.2 % an operator (SPLIT:
  local-first routing keeps 99.8 % of every edge there, and every kept request takes the table route), the
  value with which the simulator reproduces its throughput, β and γ fixed. MIX (even operators on worker 0,
  odd ones split over workers 0 and 1) is only a check: its worker 0 also sends and receives 2.5 remote
  requests per record, whose mispricing a fit on MIX would absorb into α_split (docs/SIMULATOR.md);
  `--alpha-split-from mix` fits on it.
- **α_keyed** (µs per chained request into a keyed operator whose key groups are not all on the sending
  worker: the runtime's keyed table route, `clasp/runtime/executor.py` `send`, key function, key-group
  lookup and hit count per output, local or remote, in place of α or β_s): WC with its split on worker 0
  and its count on worker 1 (KEYED: every word through that route), the value with which the simulated
  sender spends what the measured one did per line (its CPU over the run's throughput), every other
  coefficient fixed. First the same run's receiver settles where WC's residual ε sits: the part of
  count's ε with which the simulated receiver spends what the measured one did moves to split (on one
  worker a record costs the same; the key function per word runs at the emit, on split's worker). Only
  when WC is among `--apps` (`--no-keyed` skips it); fitted last: the SYN runs route no keyed requests.
- **message_us** (µs per data message at each end, `clasp.sim.simulator.Costs.message_us`): ALT and FAN run
  again with batches capped at SMALL_BATCH rows instead of 2,000 (`--message-lever batch`, the default) or
  with the workers flushing every FAST_FLUSH_MS instead of 1 ms (`--message-lever flush`, the rule before:
  under saturation it moves the message count little) — same rows, more and smaller messages; the common
  slope of worker CPU per record against message ends per record (the workers' message counters) within
  each placement (`fit_message_us`). It is fitted first; β and α_split are then fitted with it in the
  simulator, and γ is fixed to 0 (the per-destination cost is carried by the
  messages). `--fit-gamma` keeps the old rule: γ fitted on FAN after message_us.
- **β_split** (µs more per remote chained request to a stateless operator with more than one holder: the
  table route deals out remote outputs as it does local ones): FAN, whose worker 0 sends every other
  operator's requests to two holders, the value with which the simulator reproduces its throughput, after
  β and α_split (γ 0; with `--fit-gamma` γ takes FAN instead and β_split is 0).
- **β's receive share**: 0.5, assumed (RECEIVE_SHARE), unless `beta_from="pipe"` (`--beta-from pipe`):
  then β and the share are those with which the simulator reproduces PIPE (SYN's first five operators on
  worker 1, the last five on worker 0: one remote chained request per record, worker 1 only sends, worker
  0 only receives, as in CLASP's chunked placements), its throughput and its receiver's CPU over its
  sender's in the same run (`fit_pipe`). Not the default: with PIPE's β the simulator puts ALT at about
  twice its measured throughput (2026-12-04: 123,463 against 66,231 / 64,720; docs/SIMULATOR.md). PIPE is
  measured by default and reported as a check.
- **τ̄** per app and operator: the engine times requests with a wall clock, so under a quota τ̄ includes
  the stalls of throttling (a no-op reads 0.1–1.5 µs instead of 0.1); the shares come from an unlimited
  one-worker run of the app (plus F at its source and sink), and a per-request residual ε (the runtime's
  work per request that neither τ̄ nor α covers: routing, key lookups, progress counts) is added to every
  operator so that one quota-limited worker predicts exactly the measured Λ₁: Σ m_o·(τ̄_o + ε) + α·C = W / Λ₁
  (m_o requests of o and C chained requests per record). If the unlimited τ̄ already exceed that, they
  are scaled down instead (reported as a negative ε).

- **planner_us**, **client_us** (µs of the planner's and of the client's CPU per record: the planner
  admits at most 10⁶ / planner_us records/s, and on one host both take their share before the workers,
  `clasp.sim.simulator.Costs`): the median over the one-worker SYN runs of the planner's (the client's)
  CPU over the steady window per completed record (`front_costs`; SYN runs fastest, so the planner's
  base load weighs least). `--front-only` measures just these into an existing file.

The file's "measured" block records the date, the quota, the method and every raw figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from itertools import chain
from pathlib import Path

from clasp.bench import cluster_engine as ce
from clasp.core.model import FLUSH_PEER_FACTOR, remote_destinations
from clasp.sim.simulator import MEASURED_COSTS_FILE

# The calibrated file is package data of clasp.sim, where `clasp bench` and `clasp simulate` look for it.
OUT = MEASURED_COSTS_FILE
CPU_PER_WORKER = 0.25
SYN_OPS = [f"op{i}" for i in range(10)]
ALT = {o: {i % 2: 1.0} for i, o in enumerate(SYN_OPS)}  # every chained request remote, δ = 1
# Share of β the receiving worker pays (clasp.sim.simulator.Costs.receive_share): assumed. PIPE measures SYN's
# receiver at 0.30–0.44 of β, but a keyed receiver (WC's hot-key owner) pays more per remote request, and 0.5
# with β from ALT validates both apps (docs/SIMULATOR.md).
RECEIVE_SHARE = 0.5
FAN = {o: ({0: 1.0} if i % 2 == 0 else {1: 0.5, 2: 0.5}) for i, o in enumerate(SYN_OPS)}  # δ = 2 on worker 0
# Two chunks, as CLASP places a chain: worker 1 runs the source half and only sends, worker 0 the sink half
# and only receives; one remote chained request per record.
PIPE = {o: ({1: 1.0} if i < len(SYN_OPS) // 2 else {0: 1.0}) for i, o in enumerate(SYN_OPS)}
PIPE_RECEIVER, PIPE_SENDER = 0, 1
# Every operator nearly all on worker 0, its share there falling by 0.2 % an operator: the runtime routes
# local first, so worker 0 keeps 99.8 % of each edge and sends the surplus to worker 1, and every chained
# request it keeps takes the table route (two destinations), the request α_split prices. (Equal shares
# everywhere would keep all of them on the direct path.)
SPLIT = {o: {0: 0.99 - 0.002 * i, 1: 0.01 + 0.002 * i} for i, o in enumerate(SYN_OPS)}
# Even operators on worker 0, odd ones split over workers 0 and 1: worker 0's even operators route half of
# their outputs locally through the runtime's table route (the successor has two holders), the chained
# request that α_split prices; every other request is single-holder local or remote. Not a spread.
MIX = {o: ({0: 1.0} if i % 2 == 0 else {0: 0.5, 1: 0.5}) for i, o in enumerate(SYN_OPS)}
# WC with its split on worker 0 and its count on worker 1: every word leaves through the keyed table route.
KEYED = {"split": {0: 1.0}, "count": {1: 1.0}}
KEYED_SENDER, KEYED_RECEIVER = 0, 1
# ALT and FAN once more with the workers flushing every 0.1 ms instead of 1 ms: the same rows in about twice
# the messages, which gives the per-message cost (fit_message_us) from placements that are not the spread.
FAST_FLUSH_MS = 0.1
# The other lever on the message count (`--message-lever batch`, the default): ALT and FAN again with
# batches capped at SMALL_BATCH rows instead of 2,000. Under saturation the engine flushes once per
# scheduling round (~1 ms of work), so a 0.1 ms flush delay moved the message count by only 5-20 % and the
# slope was mostly noise (120 µs quiet, 601 µs loaded); a cap of 50 rows multiplies it several times.
SMALL_BATCH = 50
# The shorter SYN chain run beside the ten on one worker (clasp.apps.syn.chain): five operators, four chained
# requests per record, half of the ten's, so the two per-record costs differ by five α + τ̄ and α and F
# are equally well determined.
SHORT_CHAIN = 5
# Share of the per-record cost F charged at the source (the planner's input); the rest at the sink
# (completion). Assumed, like RECEIVE_SHARE: both ends sit on the one worker of the chain runs.
SOURCE_SHARE = 0.5


# ----------------------------------------------------------------------------- pure parts
def front_costs(runs: list[dict]) -> dict[str, float | None]:
    """µs of the planner's and of the client's CPU per completed record, the median over `runs`
    (`planner_us`, `client_us`; None where no run reports that process)."""
    def per_record(r: dict, cpu_s: float | None) -> float | None:
        if cpu_s is None or not r.get("cpu_window_s") or not r.get("throughput"):
            return None
        return cpu_s / r["cpu_window_s"] / r["throughput"] * 1e6

    out = {}
    for key, get in (("planner_us", lambda r: (r.get("cpu_s") or {}).get("planner")),
                     ("client_us", lambda r: r.get("client_cpu_s"))):
        values = [v for v in (per_record(r, get(r)) for r in runs) if v is not None]
        out[key] = round(statistics.median(values), 3) if values else None
    return out


def at_quota(r: Mapping, cpu: float) -> dict:
    """Run `r` with its throughput as if its busiest worker had had its whole quota of `cpu` CPUs: scaled by
    the quota's µs/s over that worker's CPU rate in the steady window. On a host busy with other work a
    quota-limited worker gets less than its quota (0.15-0.22 of 0.25 seen at load 7-13), run by run, and
    W / Λ then reads the host's load as the runtime's cost; scaled, it is the worker's CPU per record
    (a quiet run's factor is ~1). Unchanged without worker CPU figures."""
    win = r.get("cpu_window_s") or 0.0
    rates = [v / win for k, v in (r.get("cpu_s") or {}).items() if k != "planner" and v] if win > 0 else []
    if not rates or not r.get("throughput"):
        return dict(r)
    factor = cpu / max(rates)
    return {**r, "throughput": r["throughput"] * factor, "quota_factor": factor}


def cpu_rate_us(cpu_s: float, window_s: float) -> float:
    """µs of CPU per second of wall time."""
    if not window_s > 0:
        raise ValueError(f"window must be > 0 s, not {window_s}")
    return cpu_s / window_s * 1e6


def per_record_cost(mult: Mapping[str, float], tau: Mapping[str, float], alpha: float, chained: float) -> float:
    """µs of one record on one worker, every chained request local: Σ m_o τ_o + α·C."""
    return sum(m * tau[o] for o, m in mult.items()) + alpha * chained


def capacity(throughput: float, cost_us: float) -> float:
    """W of a saturated worker: records/s × µs per record."""
    return throughput * cost_us


def alpha_from_chain(capacity_us: float, throughput: float, tau_sum: float, chained: float) -> float:
    """α from a saturated one-worker chain: (W/Λ − Σ τ) / chained requests per record."""
    return (capacity_us / throughput - tau_sum) / chained


def alpha_and_record_cost(capacity_us: float, long: tuple[float, float, float],
                          short: tuple[float, float, float]) -> tuple[float, float]:
    """α and F from two saturated one-worker chains, each (throughput, Σ τ̄, chained requests per record):
    W/Λ = Σ τ̄ + α·C + F for both; α clamped at 0, F at 0 (then α is the one-chain value)."""
    (lam_l, tau_l, c_l), (lam_s, tau_s, c_s) = long, short
    if c_l == c_s:
        raise ValueError("the two chains have as many chained requests per record: α and F are not separable")
    rest_l = capacity_us / lam_l - tau_l
    rest_s = capacity_us / lam_s - tau_s
    alpha = max(0.0, (rest_l - rest_s) / (c_l - c_s))
    fixed = rest_l - alpha * c_l
    if fixed < 0:
        return max(0.0, rest_l / c_l), 0.0
    return alpha, fixed


def with_record_cost(tau: Mapping[str, float], mult: Mapping[str, float], sources: Sequence[str],
                     sinks: Sequence[str], fixed_us: float) -> dict[str, float]:
    """τ̄ with the per-record cost F added: SOURCE_SHARE·F over the source requests of a record, the rest
    over its sink requests (by multiplicity, so a record pays F in all)."""
    out = dict(tau)
    for ends, share in ((sources, SOURCE_SHARE), (sinks, 1.0 - SOURCE_SHARE)):
        per_record = sum(mult[o] for o in ends)
        if per_record > 0:
            for o in ends:
                out[o] += share * fixed_us / per_record
    return out


def fit_tau(tau: Mapping[str, float], mult: Mapping[str, float], alpha: float, chained: float,
            target_us: float) -> tuple[dict[str, float], float]:
    """τ per operator such that Σ m (τ_o + ε) + α·C = target: ε ≥ 0 added to every operator or, when the
    measured τ already exceed the target, all τ scaled down (ε reported as the negative per-request gap)."""
    requests = sum(mult.values())
    base = per_record_cost(mult, tau, alpha, chained)
    eps = (target_us - base) / requests
    if eps >= 0:
        return {o: tau[o] + eps for o in tau}, eps
    exec_us = sum(m * tau[o] for o, m in mult.items())
    room = max(0.0, target_us - alpha * chained)
    k = room / exec_us if exec_us > 0 else 0.0
    return {o: tau[o] * k for o in tau}, eps


def structure(app: str) -> tuple[dict[str, float], float]:
    """Requests per record of each operator and chained requests per record (the simulator's measurement)."""
    d = _dag(app)
    mult = d.multiplicity()
    chained = sum(mult[s] * f for (s, _), f in d.fanout.items())
    return mult, chained


def ends(app: str) -> tuple[list[str], list[str]]:
    """An app's source operators and sinks (`clasp.Dag.sources`, `sinks`)."""
    from clasp.apps import get_app

    dag = get_app(app).build_dag()
    return dag.sources(), dag.sinks()


def _dag(app: str):
    from clasp.apps import get_app
    from clasp.sim.simulator import COSTS_FILE, Costs, SimDag, app_dag

    costs = Costs.load(COSTS_FILE)
    if app in costs.tau_us:
        return app_dag(get_app(app), costs)
    dag = get_app(app).build_dag()  # a calibration chain: every fan-out 1
    return SimDag(app, [o.name for o in dag.operators], list(dag.edges), dict.fromkeys(dag.edges, 1.0),
                  {o.name: 0.0 for o in dag.operators})


def peer_messages_per_record(r: Mapping) -> float | None:
    """Data message ends (each message sent by a worker to another, counted at both ends) per completed
    record over a run's steady window, from the workers' message counters; None without them."""
    win, tput = r.get("cpu_window_s") or 0.0, r.get("throughput") or 0.0
    sent = [(w.get("window") or {}).get("messages", {}).get("sent") for w in r.get("per_worker", {}).values()]
    if not (win > 0 and tput > 0) or not sent or any(v is None for v in sent):
        return None
    return 2 * sum(sent) / win / tput


def worker_cpu_per_record(r: Mapping) -> float:
    """µs of worker CPU (all workers, /proc) per completed record over the steady window."""
    return sum(v for k, v in r["cpu_s"].items() if k != "planner") / r["cpu_window_s"] / r["throughput"] * 1e6


def fit_message_us(groups: Mapping[str, list[Mapping]]) -> tuple[float, list[dict]]:
    """µs per message end: the common slope of worker CPU per record against message ends per record,
    each group (one placement run at different flush delays, so with different message counts and the same
    rows) with its own intercept; least squares, clamped at 0. Also the points it used."""
    points, sxy, sxx = [], 0.0, 0.0
    for name, rs in groups.items():
        xy = [(peer_messages_per_record(r), worker_cpu_per_record(r), (r.get("flush_delay_ms"), r.get("max_batch")))
              for r in rs
              if r.get("cpu_window_s") and r.get("throughput")]
        xy = [(x, y, f) for x, y, f in xy if x is not None]
        points += [{"placement": name, "flush_delay_ms": f[0], "max_batch": f[1],
                    "message_ends_per_record": round(x, 5), "cpu_us_per_record": round(y, 3)} for x, y, f in xy]
        if len(xy) < 2:
            continue
        mx, my = statistics.fmean(x for x, _, _ in xy), statistics.fmean(y for _, y, _ in xy)
        sxy += sum((x - mx) * (y - my) for x, y, _ in xy)
        sxx += sum((x - mx) ** 2 for x, _, _ in xy)
    return (max(0.0, sxy / sxx) if sxx > 0 else 0.0), points


def fit_flush_delay(groups: Mapping[str, tuple[Mapping, list[Mapping]]], quota: float | None = None,
                    ) -> tuple[float | None, float, list[dict]]:
    """The effective flush delay the engine achieves at saturation and how it grows with the peers: per
    sending worker whose batches held more than one row and (with `quota`) that used at least 90 % of it,
    its CPU seconds per second over the messages per second it sent to each peer, d(n) for n peers; then
    d(n) = d₁·(1 + c·(n − 1)) by least squares where the points have more than one peer count (else c
    is clasp.core.model.FLUSH_PEER_FACTOR). ({name: (SYN placement, runs at the default flush delay)}.)
    Returns (d₁ or None without points, c, the points). The simulator's and the extended model's message
    count per pair follow from them."""
    edges = {(a, b): 1.0 for a, b in zip(SYN_OPS, SYN_OPS[1:], strict=False)}
    points = []
    for name, (placement, rs) in groups.items():
        peers = remote_destinations({o: {int(w): f for w, f in s.items()} for o, s in placement.items()}, edges)
        for r in rs:
            win = r.get("cpu_window_s") or 0.0
            for key, w in (r.get("per_worker") or {}).items():
                m = (w.get("window") or {}).get("messages") or {}
                i, sent, rows = int(key), m.get("sent") or 0, m.get("sent_rows") or 0
                cpu = (r.get("cpu_s") or {}).get(i, (r.get("cpu_s") or {}).get(str(i)))
                if not (win > 0 and sent > 0 and rows > 2 * sent and cpu and peers.get(i)):
                    continue
                if quota is not None and cpu / win < 0.9 * quota:
                    continue
                per_peer = sent / win / len(peers[i])
                points.append({"placement": name, "worker": i, "peers": len(peers[i]),
                               "rows_per_message": round(rows / sent, 2), "cpu_share": round(cpu / win, 4),
                               "messages_per_s_per_peer": round(per_peer, 1),
                               "flush_delay_s": round(cpu / win / per_peer, 6)})
    if not points:
        return None, FLUSH_PEER_FACTOR, points
    xs = [p["peers"] - 1 for p in points]
    ys = [p["flush_delay_s"] for p in points]
    if len(set(xs)) > 1:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        base = my - slope * mx
        if base > 0 and slope >= 0:
            return base, slope / base, points
    c = FLUSH_PEER_FACTOR
    return statistics.median(y / (1 + c * x) for x, y in zip(xs, ys, strict=True)), c, points


def solve(f, lo: float, hi: float, target: float, iters: int = 30) -> float:
    """x in [lo, hi] with f(x) = target for a decreasing f, to within (hi - lo) / 2^(iters + 1) as `iters`
    bisections would find it; the nearer bound if out of range. Each f here is a simulated run, so the steps
    are ITP's (interpolate, truncate, project; Oliveira and Takahashi 2020): the secant's guess, kept within
    what bisection would have left, takes far fewer runs where f is nearly linear about the root (the keyed
    fit's: 56 instead of 132) and never more than one beyond bisection."""
    f_lo, f_hi = f(lo), f(hi)
    if target >= f_lo:
        return lo
    if target <= f_hi:
        return hi
    a, b, ga, gb = lo, hi, target - f_lo, target - f_hi  # g = target - f rises through 0 in [a, b]
    eps = (hi - lo) / 2 ** (iters + 1)
    k1 = 0.2 / (hi - lo)
    for j in range(iters + 1):
        if b - a <= 2 * eps:
            break
        mid = (a + b) / 2
        secant = (gb * a - ga * b) / (gb - ga)
        toward = math.copysign(1.0, mid - secant)
        shift = k1 * (b - a) ** 2
        x = secant + toward * shift if shift <= abs(mid - secant) else mid
        reach = eps * 2 ** (iters + 1 - j) - (b - a) / 2  # how far from mid keeps the worst case bisection's
        if abs(x - mid) > reach:
            x = mid - toward * reach
        g = target - f(x)
        if g > 0:
            b, gb = x, g
        elif g < 0:
            a, ga = x, g
        else:
            return x
    return (a + b) / 2


# ----------------------------------------------------------------------------- measuring
def _runs(fn, repeat: int, **kw) -> list[dict]:
    out = []
    for _ in range(repeat):
        r = fn(**kw)
        if not r["correct"]:
            raise ce.EngineError(f"{kw} gave a wrong answer")
        out.append(r)
        print(json.dumps({"run": {k: kw[k] for k in ("app", "workers") if k in kw},
                          "throughput": round(r["throughput"]), "cpu_s": r["cpu_s"],
                          "window_s": r["cpu_window_s"]}), file=sys.stderr, flush=True)
    return out


def _mean_tput(runs: list[dict]) -> float:
    return statistics.fmean(r["throughput"] for r in runs)


def _sim_placement(fractions: dict, workers: int):
    from clasp.core.policies import uniform_placement

    base = uniform_placement(list(fractions), [], workers, 10, 1.0, "calibration", "calibration")
    return dataclasses.replace(base, fractions={o: dict(f) for o, f in fractions.items()})


# A fit's simulated run: it reads throughput and utilization only, so no latency samples (most of a run's time,
# and nothing else draws on the random stream: the figures are those of a run that samples).
_FIT_RUN = {"duration": 6.0, "warmup": 2.0, "latency_samples": 0}


@functools.cache
def _syn_shape():
    """SYN's SimDag with the committed file's τ̄: its fan-outs, measured once (a local run of the app) for the
    hundreds of simulations a fit makes."""
    from clasp.apps import get_app
    from clasp.sim.simulator import COSTS_FILE, Costs, app_dag

    return app_dag(get_app("syn"), Costs.load(COSTS_FILE))


def _sim_run(costs, placement: dict, workers: int):
    from clasp.sim.simulator import SimConfig, Simulator

    shape = _syn_shape()
    dag = dataclasses.replace(shape, tau_us={o: costs.tau_us["syn"][o] for o in shape.operators})
    return Simulator(dag, costs, workers, placement=_sim_placement(placement, workers),
                     config=SimConfig(**_FIT_RUN)).run()


def _sim_tput(costs, placement: dict, workers: int) -> float:
    return _sim_run(costs, placement, workers).throughput


@functools.cache
def _wc_shape():
    """WC's SimDag with the committed file's τ̄ (its fan-out and key weights, measured once)."""
    from clasp.apps import get_app
    from clasp.sim.simulator import COSTS_FILE, Costs, app_dag

    return app_dag(get_app("wc"), Costs.load(COSTS_FILE))


def _sim_wc_run(costs, placement: dict, workers: int):
    from clasp.sim.simulator import SimConfig, Simulator

    shape = _wc_shape()
    dag = dataclasses.replace(shape, tau_us={o: costs.tau_us["wc"][o] for o in shape.operators})
    return Simulator(dag, costs, workers, placement=_sim_placement(placement, workers),
                     config=SimConfig(**_FIT_RUN, key_skew=True)).run()


def keyed_worker_cost(runs: Sequence[Mapping], worker: int) -> float:
    """µs of KEYED's `worker`'s CPU per completed line, the mean over runs."""
    return statistics.fmean(_cpu(r, worker) / r["cpu_window_s"] / r["throughput"] * 1e6 for r in runs)


def _sim_keyed_cost(costs, worker: int) -> float:
    r = _sim_wc_run(costs, KEYED, 2)
    return r.utilization[worker] * costs.capacity / r.throughput


def with_keyed_shift(costs, shift: float, mult: Mapping[str, float]):
    """WC's τ̄ with `shift` µs per count request moved onto split's requests (a record's total unchanged, so
    one worker predicts what it did)."""
    t = dict(costs.tau_us["wc"])
    t["count"] -= shift
    t["split"] += shift * mult["count"] / mult["split"]
    return dataclasses.replace(costs, tau_us={**costs.tau_us, "wc": t})


def fit_keyed_shift(base, receiver_cost: float, most: float, mult: Mapping[str, float]) -> float:
    """How much of count's per-request residual ε belongs to split: the shift with which the simulator's
    KEYED receiver spends what the measured one did per line. One worker's runs spread ε evenly over the
    requests; where count runs off split's worker, what the residual stood for (the key function per word,
    called at the emit) stays with split."""
    return solve(lambda x: _sim_keyed_cost(with_keyed_shift(base, x, mult), KEYED_RECEIVER),
                 0.0, most, receiver_cost, iters=20)


def receiver_cpu_ratio(runs: Sequence[Mapping]) -> float:
    """PIPE's receiver CPU over its sender's, the mean over runs (each ratio within one run)."""
    return statistics.fmean(_cpu(r, PIPE_RECEIVER) / _cpu(r, PIPE_SENDER) for r in runs)


def _cpu(r: Mapping, w: int) -> float:
    """Worker `w`'s CPU seconds in run `r` (keys as measured, or as strings after JSON)."""
    return r["cpu_s"][w] if w in r["cpu_s"] else r["cpu_s"][str(w)]


def _sim_pipe_ratio(costs) -> float:
    u = _sim_run(costs, PIPE, 2).utilization
    return u[PIPE_RECEIVER] / u[PIPE_SENDER]


def fit_pipe(base, lam_pipe: float, cpu_ratio: float, rounds: int = 4) -> tuple[float, float]:
    """β and the receive share with which the simulator reproduces SYN PIPE: its throughput (which prices
    the bottleneck's side of the remote request, the sender's when the share is small) and its receiver's
    CPU over its sender's (the other side); alternately, β from the first with the share fixed, the share
    from the second with β fixed."""
    beta, share = base.alpha, RECEIVE_SHARE
    for _ in range(rounds):
        s = share
        beta = solve(lambda b, s=s: _sim_tput(dataclasses.replace(base, beta=b, receive_share=s), PIPE, 2),
                     0.0, 50 * max(base.alpha, 1.0), lam_pipe, iters=16)
        b = beta
        # The ratio rises with the share: bisect on its negative (solve wants a decreasing function).
        share = solve(lambda x, b=b: -_sim_pipe_ratio(dataclasses.replace(base, beta=b, receive_share=x)),
                      0.0, 1.0, -cpu_ratio, iters=12)
    return beta, share


def fit_beta(base, lam_alt: float) -> float:
    """β with which the simulator reproduces SYN ALT (all chained requests remote, δ = 1), γ as in `base`."""
    return solve(lambda b: _sim_tput(dataclasses.replace(base, beta=b), ALT, 2),
                 base.alpha, 50 * max(base.alpha, 1.0), lam_alt, iters=20)


def fit_beta_gamma(base, lam_alt: float, lam_fan: float, rounds: int = 3) -> tuple[float, float]:
    """β and γ with which the simulator reproduces both SYN calibration throughputs: alternately, β from
    the δ = 1 run (all remote) and γ from the δ = 2 one."""
    beta, gamma = base.alpha, 0.0
    for _ in range(rounds):
        g = gamma
        beta = solve(lambda b, g=g: _sim_tput(dataclasses.replace(base, beta=b, gamma=g), ALT, 2),
                     base.alpha, 50 * max(base.alpha, 1.0), lam_alt, iters=20)
        gamma = fit_gamma(dataclasses.replace(base, beta=beta), lam_fan)
    return beta, gamma


def fit_beta_split(base, lam_fan: float) -> float:
    """β_split with which the simulator reproduces SYN FAN, whose worker 0 deals every other operator's
    requests out to two holders (the table route, remote), every other coefficient fixed (γ 0)."""
    return solve(lambda x: _sim_tput(dataclasses.replace(base, beta_split=x), FAN, 3), 0.0, 50.0, lam_fan, iters=20)


def fit_gamma(base, lam_fan: float) -> float:
    """γ with which the simulator reproduces SYN FAN (δ = 2 on worker 0), β as in `base`."""
    return solve(lambda x: _sim_tput(dataclasses.replace(base, gamma=x), FAN, 3),
                 0.0, 0.5 * base.capacity, lam_fan, iters=20)


def measure(cpu: float, apps: list[str], seconds: float, repeat: int, unlimited: bool = True,
            message_lever: str = "batch",
            mix: bool = True, messages: bool = True, short: bool = True, pipe: bool = True,
            keyed: bool = True) -> dict[str, dict | list]:
    """Every calibration run: one quota-limited worker per app, (with `short`) the SHORT_CHAIN SYN on one,
    (once) an unlimited one per app, SYN alternating over 2, (with `pipe`) in two chunks over 2, fanned over
    3, (with `mix`) SPLIT and MIX over 2 workers, (with `keyed`, when WC is measured) WC as KEYED over 2 and
    (with `messages`) ALT and FAN again at FAST_FLUSH_MS."""
    runs: dict = {"one": {}, "unlimited": {}}
    for app in apps:
        runs["one"][app] = _runs(ce.unthrottled, repeat, app=app, workers=1, cpu_per_worker=cpu, seconds=seconds)
    if short:
        runs["short"] = _runs(ce.unthrottled, repeat, app=f"syn{SHORT_CHAIN}", workers=1, cpu_per_worker=cpu,
                              seconds=seconds)
    if unlimited:
        for app in apps:
            runs["unlimited"][app] = _runs(ce.unthrottled, 1, app=app, workers=1, seconds=min(seconds, 5.0))
    runs["alt"] = _runs(ce.unthrottled, repeat, app="syn", workers=2, placement=ALT, cpu_per_worker=cpu,
                        seconds=seconds)
    if pipe:
        runs["pipe"] = _runs(ce.unthrottled, repeat, app="syn", workers=2, placement=PIPE, cpu_per_worker=cpu,
                             seconds=seconds)
    if mix:
        runs["split"] = _runs(ce.unthrottled, repeat, app="syn", workers=2, placement=SPLIT, cpu_per_worker=cpu,
                              seconds=seconds)
        runs["mix"] = _runs(ce.unthrottled, repeat, app="syn", workers=2, placement=MIX, cpu_per_worker=cpu,
                            seconds=seconds)
    runs["fan"] = _runs(ce.unthrottled, repeat, app="syn", workers=3, placement=FAN, cpu_per_worker=cpu,
                        seconds=seconds)
    if keyed and "wc" in apps:
        runs["keyed"] = _runs(ce.unthrottled, repeat, app="wc", workers=2, placement=KEYED, cpu_per_worker=cpu,
                              seconds=seconds)
    if messages:
        lever = ({"max_batch": SMALL_BATCH} if message_lever == "batch" else {"flush_delay_ms": FAST_FLUSH_MS})
        runs["alt_fast"] = _runs(ce.unthrottled, repeat, app="syn", workers=2, placement=ALT, cpu_per_worker=cpu,
                                 seconds=seconds, **lever)
        runs["fan_fast"] = _runs(ce.unthrottled, repeat, app="syn", workers=3, placement=FAN, cpu_per_worker=cpu,
                                 seconds=seconds, **lever)
    return runs


def fit_alpha_split(base, lam: float, placement: dict = SPLIT) -> float:
    """α_split with which the simulator reproduces SYN's throughput on `placement` (SPLIT or MIX; β, γ
    fixed: ALT and FAN have no split local requests)."""
    return solve(lambda a: _sim_tput(dataclasses.replace(base, alpha_split=a), placement, 2),
                 base.alpha, 50 * max(base.alpha, 1.0), lam, iters=20)


def fit_keyed(base, receiver_cost: float, sender_cost: float, most: float, mult: Mapping[str, float],
              rounds: int = 3) -> tuple[float, float]:
    """(shift, α_keyed) from KEYED's receiver and sender, fitted alternately: the sender's load sets how
    often it flushes, so α_keyed moves the receiver's message work a little."""
    shift, keyed = 0.0, None
    for _ in range(rounds):
        shift = fit_keyed_shift(dataclasses.replace(base, alpha_keyed=keyed), receiver_cost, most, mult)
        keyed = fit_alpha_keyed(with_keyed_shift(base, shift, mult), sender_cost)
    return shift, keyed


def fit_alpha_keyed(base, sender_cost: float) -> float:
    """α_keyed with which the simulator's KEYED sender spends what the measured one did per line (a figure
    within each run, like PIPE's CPU ratio; every other coefficient fixed: the SYN runs route no keyed
    requests), after `fit_keyed_shift` has settled what the receiver pays."""
    return solve(lambda k: -_sim_keyed_cost(dataclasses.replace(base, alpha_keyed=k), KEYED_SENDER),
                 0.0, 20.0, -sender_cost, iters=20)


def fit(runs: Mapping, cpu: float, seconds: float, repeat: int, unlimited_tau: Mapping | None = None,
        gamma_with_messages: bool = False, beta_from: str = "alt", alpha_split_from: str = "split",
        scale_to_quota: bool = True) -> dict:
    """The cost file from calibration runs (`measure`'s shape); `unlimited_tau` {app: {op: µs}} stands in
    for the unlimited runs when they are not in `runs`.

    With `scale_to_quota` (the default) W is the quota itself and every quota-limited run's throughput is
    scaled to it (`at_quota`), so that the fits read CPU per record and not how much of its quota a worker
    got on a shared host; without, W is the median CPU rate of the one-worker runs and throughputs are
    taken as measured (the rule before).

    When message_us is fitted (the fast-flush ALT/FAN runs are in `runs`), γ is fixed to 0 and β is fitted
    on ALT alone: the per-destination cost is carried by the messages (γ and message_us price the same
    per-destination traffic, and γ fitted afterwards from one FAN run is noise; docs/SIMULATOR.md). FAN is
    then a check only. `gamma_with_messages=True` restores the old rule (γ fitted on FAN after message_us).
    Without the fast-flush runs β and γ are fitted together as before.

    `beta_from` "alt" (β from ALT, receive share RECEIVE_SHARE) or "pipe" (both from PIPE, `fit_pipe`);
    `alpha_split_from` "split" or "mix": the run α_split is fitted on (the other, if present, is a check)."""
    if beta_from not in ("alt", "pipe"):
        raise ValueError(f"beta_from must be alt or pipe, not {beta_from!r}")
    if alpha_split_from not in ("split", "mix"):
        raise ValueError(f"alpha_split_from must be split or mix, not {alpha_split_from!r}")
    from clasp.sim.simulator import Costs

    one, unlimited = runs["one"], runs.get("unlimited") or {}
    apps = list(one)
    rates = [cpu_rate_us(r["cpu_s"][0], r["cpu_window_s"]) for rs in one.values() for r in rs
             if r["cpu_window_s"] > 0]
    w = statistics.median(rates)
    if scale_to_quota:
        w = cpu * 1e6

    def lam_of(rs: list[dict]) -> float:  # what the fits read: scaled to the quota (at_quota) or as measured
        return statistics.fmean((at_quota(r, cpu) if scale_to_quota else r)["throughput"] for r in rs)

    tau_u = {app: {o: v["tau_us"] for o, v in rs[0]["operators"].items()} for app, rs in unlimited.items()}
    tau_u = {**(unlimited_tau or {}), **tau_u}
    tau_q = {app: {o: statistics.fmean(r["operators"][o]["tau_us"] for r in rs) for o in rs[0]["operators"]}
             for app, rs in one.items()}
    shapes = {app: structure(app) for app in apps}
    lam1 = {app: lam_of(rs) for app, rs in one.items()}
    mult, chained = shapes["syn"]
    syn_tau = sum(m * tau_u["syn"][o] for o, m in mult.items())
    fixed, lam_short = 0.0, None
    if runs.get("short"):
        # The short chain's no-ops cost what the ten's do: τ̄ per request from the ten's unlimited run.
        m_s, c_s = structure(f"syn{SHORT_CHAIN}")
        tau_per_op = syn_tau / sum(mult.values())
        lam_short = lam_of(runs["short"])
        alpha, fixed = alpha_and_record_cost(w, (lam1["syn"], syn_tau, chained),
                                             (lam_short, tau_per_op * sum(m_s.values()), c_s))
    else:
        alpha = max(0.0, alpha_from_chain(w, lam1["syn"], syn_tau, chained))
    tau_file, eps = {}, {}
    for app in apps:
        m, c = shapes[app]
        tau_app = with_record_cost(tau_u[app], m, *ends(app), fixed)
        tau_file[app], eps[app] = fit_tau(tau_app, m, alpha, c, w / lam1[app])
    message_us, message_points = 0.0, []
    message_fitted = bool(runs.get("alt_fast") or runs.get("fan_fast"))
    if message_fitted:
        message_us, message_points = fit_message_us({"alt": list(runs["alt"]) + list(runs.get("alt_fast") or []),
                                                     "fan": list(runs["fan"]) + list(runs.get("fan_fast") or [])})
    flush, peer_factor, flush_points = fit_flush_delay({"alt": (ALT, list(runs["alt"])),
                                                        "fan": (FAN, list(runs["fan"]))}, cpu)
    base = Costs(alpha, alpha, 0.0, w, tau_file, RECEIVE_SHARE, message_us=message_us,
                 flush_delay_s=flush if flush is not None else 0.001, flush_peer_factor=peer_factor,
                 local_first=True)  # the runtime's routing (clasp.core.model.edge_flow)
    lam_alt, lam_fan = lam_of(runs["alt"]), lam_of(runs["fan"])
    gamma_zero = message_fitted and not gamma_with_messages
    gamma_rule = ("fixed 0 (message_us fitted: the per-destination cost is carried by the messages)" if gamma_zero
                  else "fitted on FAN" + (" after message_us" if message_fitted else ""))
    share, pipe_ratio = RECEIVE_SHARE, None
    if runs.get("pipe"):
        pipe_ratio = receiver_cpu_ratio(runs["pipe"])
    if beta_from == "pipe" and runs.get("pipe"):
        beta_rule = "PIPE: its throughput and its receiver's CPU over its sender's (fit_pipe); ALT a check"
        beta, share = fit_pipe(base, lam_of(runs["pipe"]), pipe_ratio)
        gamma = 0.0 if gamma_zero else fit_gamma(dataclasses.replace(base, beta=beta, receive_share=share), lam_fan)
    elif gamma_zero:
        beta_rule = f"ALT, receive share {RECEIVE_SHARE:g} assumed"
        beta, gamma = fit_beta(base, lam_alt), 0.0
    else:
        beta_rule = f"ALT (with gamma on FAN), receive share {RECEIVE_SHARE:g} assumed"
        beta, gamma = fit_beta_gamma(base, lam_alt, lam_fan)
    costs = dataclasses.replace(base, beta=beta, gamma=gamma, receive_share=share)
    alpha_split, split_rule = None, "none: α for every local request"
    split_runs = {"split": (SPLIT, runs.get("split")), "mix": (MIX, runs.get("mix"))}
    for name in (alpha_split_from, *(n for n in split_runs if n != alpha_split_from)):
        placement, rs = split_runs[name]
        if rs:
            alpha_split = fit_alpha_split(costs, lam_of(rs), placement)
            split_rule = f"fitted on {name.upper()}"
            costs = dataclasses.replace(costs, alpha_split=alpha_split)
            break
    beta_split = None
    if gamma_zero:
        beta_split = fit_beta_split(costs, lam_fan)
        costs = dataclasses.replace(costs, beta_split=beta_split)
    alpha_keyed = keyed_shift = None
    if runs.get("keyed") and "wc" in tau_file:
        keyed_shift, alpha_keyed = fit_keyed(costs, keyed_worker_cost(runs["keyed"], KEYED_RECEIVER),
                                             keyed_worker_cost(runs["keyed"], KEYED_SENDER), max(0.0, eps["wc"]),
                                             shapes["wc"][0])
        costs = dataclasses.replace(with_keyed_shift(costs, keyed_shift, shapes["wc"][0]), alpha_keyed=alpha_keyed)
        tau_file["wc"] = dict(costs.tau_us["wc"])
    check = {"alt": _sim_tput(costs, ALT, 2), "fan": _sim_tput(costs, FAN, 3)}
    for name, placement in (("pipe", PIPE), ("split", SPLIT), ("mix", MIX)):
        if runs.get(name):
            check[name] = _sim_tput(costs, placement, 2)

    def tput_list(rs):  # what the fits read, beside "simulated"
        return [round((at_quota(r, cpu) if scale_to_quota else r)["throughput"], 1) for r in rs]

    def cpu_per_record(rs):  # µs of worker CPU per completed record, per run
        return [round(sum(v for k, v in r["cpu_s"].items() if k != "planner") / r["cpu_window_s"]
                      / r["throughput"] * 1e6, 2) for r in rs if r["cpu_window_s"] > 0 and r["throughput"] > 0]

    measured = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_per_worker": cpu,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "how": ("python -m clasp.bench.calibrate: LocalCluster workers under a cgroup quota of cpu_per_worker CPUs; "
                "W = the quota, each run's throughput scaled to it (capacity_rule); alpha (and the per-record cost F, "
                "see "
                "record_cost_rule) from SYN on one worker; beta and its receive share fitted so the "
                "simulator reproduces SYN in two chunks over 2 workers (or, see beta_rule, alternating over 2); "
                "gamma on SYN even->w0, odd->w1/w2 (fixed 0 when message_us is fitted, see gamma_rule); "
                "alpha_split from SYN even->w0, odd->w0/w1; tau shares from unlimited one-worker "
                "runs plus a per-request residual epsilon so that one worker predicts its measured throughput "
                "(clasp/bench/calibrate.py docstring)"),
        "seconds": seconds, "repeat": repeat, "gamma_rule": gamma_rule, "beta_rule": beta_rule,
        "alpha_split_rule": split_rule,
        "one_worker_throughput": {app: tput_list(rs) for app, rs in one.items()},
        "worker_cpu_rate_us": [round(r) for r in rates],
        "capacity_rule": ("the quota; every quota-limited run's throughput scaled by the quota over its busiest "
                          "worker's CPU rate (at_quota); the throughputs below are scaled so, the measured ones are "
                          "those over quota_factors" if scale_to_quota
                          else "median CPU rate of the one-worker runs; throughputs as measured"),
        "quota_factors": {k: [round(at_quota(r, cpu).get("quota_factor", 1.0), 3)
                              for r in (chain.from_iterable(v.values()) if isinstance(v, Mapping) else v)]
                          for k, v in runs.items() if k != "unlimited" and v},
        "tau_us_under_quota": {a: {o: round(v, 3) for o, v in t.items()} for a, t in tau_q.items()},
        "tau_us_unlimited": {a: {o: round(v, 3) for o, v in t.items()} for a, t in tau_u.items()},
        "unlimited_throughput": {app: tput_list(rs) for app, rs in unlimited.items()},
        "epsilon_us": {a: round(v, 3) for a, v in eps.items()},
        "record_cost_us": round(fixed, 3),
        "record_cost_rule": (f"F from SYN of 10 and {SHORT_CHAIN} operators on one worker, "
                             f"{SOURCE_SHARE:g} at the sources" if lam_short else "none: folded into alpha"),
        "syn_one_worker_cpu_us_per_record": cpu_per_record(one["syn"]),
        **({f"syn{SHORT_CHAIN}_one_worker": {"throughput": tput_list(runs["short"]),
                                             "cpu_us_per_record": cpu_per_record(runs["short"])}}
           if lam_short else {}),
        "syn_alternating_2w": {"throughput": tput_list(runs["alt"]), "simulated": round(check["alt"], 1),
                               "cpu_us_per_record": cpu_per_record(runs["alt"])},
        "syn_fan_3w": {"throughput": tput_list(runs["fan"]), "simulated": round(check["fan"], 1),
                       "cpu_us_per_record": cpu_per_record(runs["fan"])},
    }
    if message_points:
        measured["message_fit"] = {"message_us": round(message_us, 3), "points": message_points}
    if pipe_ratio is not None:
        measured["syn_pipe_2w"] = {"throughput": tput_list(runs["pipe"]), "simulated": round(check["pipe"], 1),
                                   "receiver_over_sender_cpu": round(pipe_ratio, 4),
                                   "simulated_receiver_over_sender": round(_sim_pipe_ratio(costs), 4),
                                   "cpu_us_per_record": cpu_per_record(runs["pipe"])}
    if alpha_keyed is not None:
        measured["wc_keyed_2w"] = {"throughput": tput_list(runs["keyed"]),
                                   "simulated": round(_sim_wc_run(costs, KEYED, 2).throughput, 1),
                                   "sender_us_per_line": round(keyed_worker_cost(runs["keyed"], KEYED_SENDER), 3),
                                   "simulated_sender_us_per_line": round(_sim_keyed_cost(costs, KEYED_SENDER), 3),
                                   "receiver_us_per_line": round(keyed_worker_cost(runs["keyed"], KEYED_RECEIVER), 3),
                                   "simulated_receiver_us_per_line": round(_sim_keyed_cost(costs, KEYED_RECEIVER),
                                                                           3),
                                   "count_residual_moved_to_split_us": round(keyed_shift, 4),
                                   "cpu_us_per_record": cpu_per_record(runs["keyed"])}
    for name in ("split", "mix"):
        if runs.get(name):
            measured[f"syn_{name}_2w"] = {"throughput": tput_list(runs[name]), "simulated": round(check[name], 1),
                                          "cpu_us_per_record": cpu_per_record(runs[name])}
    doc = {"alpha": round(alpha, 4), "beta": round(beta, 4), "gamma": round(gamma, 1), "capacity": round(w, 1),
           "receive_share": round(share, 4)}
    if alpha_split is not None:
        doc["alpha_split"] = round(alpha_split, 4)
    if beta_split is not None:
        doc["beta_split"] = round(beta_split, 4)
    if alpha_keyed is not None:
        doc["alpha_keyed"] = round(alpha_keyed, 4)
    if message_us > 0:
        doc["message_us"] = round(message_us, 3)
    if flush is not None:
        doc["flush_delay_s"] = round(flush, 6)
        doc["flush_peer_factor"] = round(peer_factor, 4)
        measured["flush_fit"] = {"flush_delay_s": round(flush, 6), "flush_peer_factor": round(peer_factor, 4),
                                 "points": flush_points}
    doc["local_first"] = True
    front = front_costs(one["syn"])
    doc.update({k: v for k, v in front.items() if v is not None})
    measured["front_rule"] = FRONT_RULE
    doc["tau_us"] = {a: {o: round(v, 4) for o, v in t.items()} for a, t in tau_file.items()}
    doc["measured"] = measured
    return doc


def calibrate(cpu: float, apps: list[str], seconds: float, repeat: int, mix: bool = True,
              messages: bool = True, gamma_with_messages: bool = False, short: bool = True,
              pipe: bool = True, beta_from: str = "alt", alpha_split_from: str = "split",
              message_lever: str = "batch", keyed: bool = True, runs: Mapping | None = None,
              runs_out: str | None = None) -> dict:
    """Measure (or take `runs`, a `--runs-out` file's content, measured before) and fit."""
    if runs is None:
        runs = measure(cpu, apps, seconds, repeat, mix=mix, messages=messages, short=short, pipe=pipe,
                       message_lever=message_lever, keyed=keyed)
        ce.shutdown()
        if runs_out:
            Path(runs_out).write_text(json.dumps(runs) + "\n")
    doc = fit(runs, cpu, seconds, repeat, gamma_with_messages=gamma_with_messages, beta_from=beta_from,
              alpha_split_from=alpha_split_from)
    if pipe and beta_from == "alt":
        # The other rule on the same runs: β and its receive share from PIPE, so that β_s and β_r are each
        # measured and not only their sum (docs/results-log.md, "Remote path" compares both).
        other = fit(runs, cpu, seconds, repeat, gamma_with_messages=gamma_with_messages, beta_from="pipe",
                    alpha_split_from=alpha_split_from)
        doc["measured"]["pipe_fit"] = {k: other.get(k) for k in ("alpha", "beta", "receive_share", "message_us",
                                                                 "alpha_keyed")}
    return doc


def int_keys(obj):
    """JSON's string keys back to the worker indices they were ("0" → 0), everywhere in `obj`."""
    if isinstance(obj, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: int_keys(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [int_keys(v) for v in obj]
    return obj


FRONT_RULE = ("planner_us, client_us: median over the one-worker SYN runs of the planner's (the client's) CPU "
              "over the steady window per completed record (SYN runs fastest, so the planner's base load, "
              "about 0.06 CPU, weighs least)")


def update_front(path: Path, cpu: float, seconds: float, repeat: int) -> int:
    """`--front-only`: the front costs from one-worker SYN runs, written into the cost file at `path`."""
    from clasp.sim.simulator import Costs

    doc = json.loads(path.read_text())
    runs = _runs(ce.unthrottled, repeat, app="syn", workers=1, cpu_per_worker=cpu, seconds=seconds)
    front = front_costs(runs)
    doc.update({k: v for k, v in front.items() if v is not None})
    doc.setdefault("measured", {})["front"] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "cpu_per_worker": cpu,
        "seconds": seconds, "repeat": repeat, **front,
        "rule": "python -m clasp.bench.calibrate --front-only; " + FRONT_RULE}
    Costs.from_json_dict(doc)  # the simulator must load it
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(front | {"out": str(path)}))
    return 0


def main(argv=None) -> int:
    from clasp.apps import APPS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-per-worker", type=float, default=CPU_PER_WORKER, help="CPU quota per worker")
    ap.add_argument("--apps", default=",".join(APPS), help="apps whose τ̄ to measure (syn is always included)")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per measured run")
    ap.add_argument("--repeat", type=int, default=2, help="runs per quota-limited configuration")
    ap.add_argument("--out", default=str(OUT), help="the cost file to write")
    ap.add_argument("--no-mix", action="store_true",
                    help="skip the SPLIT and MIX runs (no alpha_split: α for every local)")
    ap.add_argument("--no-messages", action="store_true",
                    help="skip the fast-flush ALT and FAN runs (no message_us: no per-message cost)")
    ap.add_argument("--no-short", action="store_true",
                    help=f"skip the {SHORT_CHAIN}-operator SYN run (no per-record cost F: it is folded into α)")
    ap.add_argument("--no-pipe", action="store_true", help="skip the PIPE run (a check unless --beta-from pipe)")
    ap.add_argument("--no-keyed", action="store_true",
                    help="skip WC's KEYED run (no alpha_keyed: a keyed request costs α or β_s like any other)")
    ap.add_argument("--beta-from", choices=("alt", "pipe"), default="alt",
                    help="fit β on ALT (receive share 0.5) or β and the share on PIPE (docs/SIMULATOR.md)")
    ap.add_argument("--alpha-split-from", choices=("split", "mix"), default="split",
                    help="the run α_split is fitted on (mix: a check only, docs/SIMULATOR.md)")
    ap.add_argument("--message-lever", choices=("batch", "flush"), default="batch",
                    help=f"more messages for the message_us fit by batches of {SMALL_BATCH} rows (batch) or a "
                         f"{FAST_FLUSH_MS} ms flush delay (flush, the rule before)")
    ap.add_argument("--runs-out", help="also write the raw runs here, for --from-runs")
    ap.add_argument("--from-runs", help="fit the runs of an earlier --runs-out instead of measuring (its quota, "
                                         "seconds and repeat are what --cpu-per-worker, --seconds, --repeat say)")
    ap.add_argument("--fit-gamma", action="store_true",
                    help="also fit γ on FAN when message_us is fitted (the old rule; default: γ = 0 then)")
    ap.add_argument("--front-only", action="store_true",
                    help="measure only planner_us and client_us (one-worker SYN runs) and set them in the "
                         "existing --out file, every other coefficient kept")
    args = ap.parse_args(argv)
    apps = [a.strip() for a in args.apps.split(",") if a.strip()]
    if "syn" not in apps:
        apps.append("syn")
    for a in apps:
        if a not in APPS:
            ap.error(f"unknown app {a!r}")
    if args.front_only:
        return update_front(Path(args.out), args.cpu_per_worker, args.seconds, args.repeat)
    doc = calibrate(args.cpu_per_worker, apps, args.seconds, args.repeat, mix=not args.no_mix,
                    messages=not args.no_messages, gamma_with_messages=args.fit_gamma, short=not args.no_short,
                    pipe=not args.no_pipe, beta_from=args.beta_from, alpha_split_from=args.alpha_split_from,
                    message_lever=args.message_lever, keyed=not args.no_keyed,
                    runs=int_keys(json.loads(Path(args.from_runs).read_text())) if args.from_runs else None,
                    runs_out=args.runs_out)
    from clasp.sim.simulator import Costs

    Costs.from_json_dict(doc)  # the simulator must load it
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc.get(k) for k in ("alpha", "beta", "gamma", "capacity", "alpha_split", "beta_split",
                                               "alpha_keyed", "message_us", "flush_delay_s")}
                     | {"pipe_fit": doc["measured"].get("pipe_fit"), "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
