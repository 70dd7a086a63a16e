"""Validate the simulator against the emulated cluster: same app, same profile, 1–5 workers.

`python -m clasp.bench.validate_sim [--cpu-per-worker F] [--apps wc,syn] [--workers 1,2,3,4,5] [--repeat K]
[--seconds S] [--costs FILE] [--write-costs FILE] [--plot out/validate_sim.png] [--json FILE]`

Without `--costs` (the default) calibration and validation are **interleaved**, so that drift in the
machine's speed (a shared host) cancels: per repeat, the `clasp.bench.calibrate` runs (one worker per app and
the short SYN chain, SYN ALT, PIPE, SPLIT and MIX over 2, FAN over 3 workers) and the validation runs (every app
over 1..5 workers) are measured back to back, worker count by worker count; that repeat's cost file is
fitted from its own calibration runs only and compared with its own validation runs (a JSON line per
repeat and point). A
pooled cost file (all repeats' calibration runs) is compared with the mean of the validation runs and,
with `--write-costs FILE` (e.g. clasp/sim/sim_costs_measured.json), written there (τ̄ of apps not measured
are carried over from that file). Fitted: the one-worker points (the same placement as the calibration's one-
worker runs, by construction reproduced up to run-to-run noise). Validated: 2..N workers, under placements
no calibration run has (CLASP's chunks with a split operator at every boundary, or spreads). Beside
`ratio`, the same points under the other rules (`predictions`): `ratio_no_split` (no α_split),
`ratio_no_messages`, `ratio_pipe_beta` or `ratio_alt_beta` (β from the other of PIPE and ALT,
`--beta-from`) and `ratio_mix_split` or `ratio_split_split` (α_split from the other of MIX and SPLIT,
`--alpha-split-from`).

With `--costs FILE`, the old mode: the file as given, emulated runs only.

For every app and worker count: unthrottled, autoscaling off, under CLASP's placement for that many workers
(`--placement clasp`, the default: the figures' placements, planned on the committed cost file) or every
operator spread evenly over the workers (`--placement spread`, the worst case for chaining).
`--speed-reference` (interleaved mode) runs the app on one of the n workers just before each validation
run and also reports `ratio_speed_reference`, the prediction scaled to the host's speed at that moment.
Emulated: `clasp.bench.cluster_engine.unthrottled` on a LocalCluster whose workers are each limited to F CPUs
(cgroup quota), `--repeat` times (the apps and repetitions interleaved on one cluster per worker count, so
a burst of load from the machine's other users hits all of them alike); the figure is the mean, the spread
(max − min) / mean is reported. Simulated: `simulate(app_dag(app, costs), n, costs=costs,
config=SimConfig(key_skew=True, host_capacity=…))` with the calibrated cost file (`clasp.bench.calibrate`,
measured under the same quota), the planner, the client and the workers sharing this host's CPUs as they do
when emulated (`--host-cpus`). Prints a JSON line per point (emulated, simulated, ratio = simulated /
emulated) and a final summary line with the largest |ratio − 1|; draws workers against throughput, emulated
and simulated lines per app.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import statistics
import sys
from pathlib import Path

from clasp.bench import cluster_engine as ce
from clasp.sim.simulator import MEASURED_COSTS_FILE

# The calibrated file is package data of clasp.sim, where `clasp bench` and `clasp simulate` look for it.
COSTS = MEASURED_COSTS_FILE
# The calibration runs besides the one-worker ones, by clasp.bench.calibrate's names.
CALIB_RUNS = ("short", "alt", "pipe", "split", "mix", "fan", "alt_fast", "fan_fast")
TOLERANCE = 0.15


def placements(apps: list[str], workers: list[int], mode: str, costs_file: Path = COSTS, costs=None,
               ) -> dict[tuple[str, int], object]:
    """The placement of every point, the same in both engines: a policy's own placement for n workers
    (`clasp`, `clasp-paper`, a baseline: `clasp.bench.sim_engine.SimEngine.policy_placement`, planned on the
    committed cost file, as the figures' placements are), or `spread` (None: every operator over every
    worker, the worst case for chaining). `costs_file`: the costs the policies plan with (`costs`: those
    costs already loaded, e.g. rescaled to another quota)."""
    if mode == "spread":
        return {(a, n): None for a in apps for n in workers}
    from clasp.bench.sim_engine import SimEngine
    from clasp.core.policies import POLICIES
    from clasp.sim.simulator import Costs

    if mode not in POLICIES:
        raise ValueError(f"placement must be spread or a policy ({', '.join(POLICIES)}), not {mode!r}")
    engine = SimEngine(costs if costs is not None else Costs.load(costs_file), source=str(costs_file))
    return {(a, n): engine.policy_placement(a, mode, n) for a in apps for n in workers}


# The emulated cluster runs the planner, the client and every worker on this host: the simulator shares
# its CPUs among them (SimConfig.host_capacity; `--host-cpus 0` gives each its own host).
HOST_CPUS = os.cpu_count() or 1


def simulated(apps: list[str], workers: list[int], costs, placed: dict | None = None,
              duration: float = 20.0, host_cpus: float | None = HOST_CPUS,
              detail: dict | None = None) -> dict[tuple[str, int], float]:
    """Simulated throughput per (app, n); with `detail`, also fills it per (app, n) with what `_brief`
    reports of an emulated run, as the simulator predicts it (`_sim_brief`)."""
    from clasp.apps import get_app
    from clasp.sim.simulator import SimConfig, Simulator, app_dag

    out = {}
    for app in apps:
        dag = app_dag(get_app(app), costs, records=20_000)  # fan-outs and key-group weights of the app's input
        for n in workers:
            cfg = SimConfig(duration=duration, warmup=2.0, key_skew=True,
                            host_capacity=host_cpus * 1e6 if host_cpus else None)
            pl = (placed or {}).get((app, n))
            res = Simulator(dag, costs, n, placement=pl, config=cfg).run()
            out[(app, n)] = res.throughput
            if detail is not None:
                detail[(app, n)] = _sim_brief(res, costs.capacity, warmup=cfg.warmup)
    return out


def _sim_brief(res, capacity: float, warmup: float) -> dict:
    """The simulator's CPU rate per worker (CPUs), worker CPU per record and data message ends per record
    over the seconds after the warm-up: the emulated run's `_brief`, predicted."""
    after = [s for s in res.seconds if s.t >= warmup] or res.seconds
    cpu = [u * capacity / 1e6 for u in res.utilization]
    ends = statistics.fmean(sum(w.messages_out + w.messages_in for w in s.observation.workers.values())
                            for s in after) if after else 0.0
    tput = res.throughput or math.nan
    return {"throughput": round(res.throughput, 1), "cpu_rate": [round(c, 3) for c in cpu],
            "cpu_us_per_record": round(sum(cpu) * 1e6 / tput, 2) if res.throughput else None,
            "message_ends_per_record": round(ends / tput, 5) if res.throughput else None}


def _fractions(placed: dict | None, app: str, n: int):
    pl = (placed or {}).get((app, n))
    return "spread" if pl is None else pl.fractions


def _run(app: str, n: int, cpu: float, seconds: float, placement="spread", flush_delay_ms: float | None = None) -> dict:
    r = ce.unthrottled(app, n, placement=placement, cpu_per_worker=cpu, seconds=seconds, flush_delay_ms=flush_delay_ms)
    if not r["correct"]:
        raise ce.EngineError(f"{app} on {n} workers gave a wrong answer")
    return r


def _brief(r: dict) -> dict:
    win = r["cpu_window_s"] or math.nan
    workers = sorted(k for k in r["cpu_s"] if k != "planner")
    return {"throughput": round(r["throughput"], 1), "window_s": r["seconds"],
            "cpu_rate": [round(r["cpu_s"][k] / win, 3) for k in workers],
            "cpu_us_per_record": round(sum(r["cpu_s"][k] for k in workers) / win / r["throughput"] * 1e6, 2)
            if r["throughput"] else None,
            "throttled_periods": [round(r["throttle"][k]["nr_throttled"] / max(r["throttle"][k]["nr_periods"], 1), 2)
                                  for k in workers if k in r.get("throttle", {})],
            "run_delay_rate": [round(r["run_delay_s"][k] / win, 3) for k in workers if k in r.get("run_delay_s", {})],
            "message_ends_per_record": _msg_ends(r),
            "messages_sent_per_s": [round(((w.get("window") or {}).get("messages", {}).get("sent", 0)) / win, 1)
                                    for _, w in sorted(r.get("per_worker", {}).items(), key=lambda kv: str(kv[0]))]}


def _msg_ends(r: dict) -> float | None:
    from clasp.bench.calibrate import peer_messages_per_record

    v = peer_messages_per_record(r)
    return None if v is None else round(v, 5)


def interleaved_repeat(apps: list[str], workers: list[int], cpu: float, seconds: float, k: int,
                       placed: dict | None = None, speed_reference: bool = False) -> tuple[dict, dict, dict]:
    """One repeat: calibration and validation runs back to back, worker count by worker count; with
    `speed_reference`, each validation run of n ≥ 2 workers right after the app on one of those workers
    (the rest idle): the host's speed at that moment (returned as the third dict, by (app, n))."""
    from clasp.bench import calibrate as cal

    calib: dict = {"one": {}, **{k: [] for k in CALIB_RUNS}}
    val: dict = {}
    ref: dict = {}
    for n in sorted(set(workers) | {1, 2, 3}):
        todo = []
        if n == 1:
            todo += [("calib-one", a, 1, "spread") for a in apps] + [("calib-short", f"syn{cal.SHORT_CHAIN}", 1,
                                                                       "spread")]
        if n == 2:
            todo += [("calib-alt", "syn", 2, cal.ALT), ("calib-pipe", "syn", 2, cal.PIPE),
                     ("calib-split", "syn", 2, cal.SPLIT), ("calib-mix", "syn", 2, cal.MIX)]
        if n == 3:
            todo += [("calib-fan", "syn", 3, cal.FAN)]
        if n in workers:
            for a in apps:
                if speed_reference and n > 1:
                    todo.append(("reference", a, n, {o: {0: 1.0} for o in _operators(a)}))
                todo.append(("validate", a, n, _fractions(placed, a, n)))
        # The fast-flush runs (message_us) last: they need a cluster of their own.
        if n == 2:
            todo += [("calib-alt_fast", "syn", 2, cal.ALT)]
        if n == 3:
            todo += [("calib-fan_fast", "syn", 3, cal.FAN)]
        for kind, app, m, pl in todo:
            r = _run(app, m, cpu, seconds, pl, cal.FAST_FLUSH_MS if kind.endswith("_fast") else None)
            if kind == "calib-one":
                calib["one"][app] = [r]
            elif kind == "validate":
                val[(app, m)] = r
            elif kind == "reference":
                ref[(app, m)] = r
            else:
                calib[kind.split("-")[1]].append(r)
            print(json.dumps({"repeat": k, "run": kind, "app": app, "workers": m} | _brief(r)), file=sys.stderr,
                  flush=True)
        ce.shutdown()
    return calib, val, ref


def _operators(app: str) -> list[str]:
    from clasp.apps import get_app

    return [o.name for o in get_app(app).build_dag().operators]


def _speed_ratio(sim: dict, refs: list[float], emulated: float, app: str, n: int) -> float | None:
    """Simulated over emulated with the simulation scaled to the host's speed at the time: the one-worker
    reference runs' mean over the simulator's one-worker throughput."""
    if not refs or not sim.get((app, 1)) or not emulated:
        return None
    return round(sim[(app, n)] * statistics.fmean(refs) / sim[(app, 1)] / emulated, 4)


def predictions(apps: list[str], workers: list[int], calib: dict, repeat: int, placed: dict | None,
                tau_u: dict, args) -> tuple[dict, dict[str, dict]]:
    """The cost file fitted from `calib` under the chosen rules and what it predicts (""), beside the
    variants the report compares it with: without α_split, without the message cost, β from the other of
    ALT and PIPE, α_split from the other of SPLIT and MIX (each when its runs are there)."""
    from clasp.bench import calibrate as cal
    from clasp.sim.simulator import Costs

    def fit_doc(beta_from: str = args.beta_from, split_from: str = args.alpha_split_from) -> dict:
        return cal.fit(calib, args.cpu_per_worker, args.seconds, repeat, unlimited_tau=tau_u,
                       gamma_with_messages=args.fit_gamma, beta_from=beta_from, alpha_split_from=split_from)

    def fitted(**rule) -> Costs:
        return Costs.from_json_dict(fit_doc(**rule))

    doc = fit_doc()
    costs = Costs.from_json_dict(doc)
    def sim(c: Costs) -> dict:
        return simulated(apps, workers, c, placed, host_cpus=args.host_cpus)

    sims = {"": sim(costs), "no_split": sim(dataclasses.replace(costs, alpha_split=None)),
            "no_messages": sim(dataclasses.replace(costs, message_us=0.0))}
    other_beta = "pipe" if args.beta_from == "alt" else "alt"
    if calib.get("pipe"):
        sims[f"{other_beta}_beta"] = sim(fitted(beta_from=other_beta))
    other_split = "mix" if args.alpha_split_from == "split" else "split"
    if calib.get(other_split):
        sims[f"{other_split}_split"] = sim(fitted(split_from=other_split))
    return doc, sims


def _coefficients(doc: dict) -> dict:
    keys = ("alpha", "alpha_split", "alpha_keyed", "beta", "beta_split", "receive_share", "gamma", "capacity",
            "message_us")
    return {c: doc.get(c) for c in keys} | {"record_cost_us": doc["measured"]["record_cost_us"]}


def interleaved(args, apps: list[str], workers: list[int], cpu: float) -> int:
    from clasp.sim.simulator import Costs

    run_apps = apps + ([] if "syn" in apps else ["syn"])
    placed = placements(apps, workers, args.placement)
    unlimited = {a: [_run_unlimited(a, args.seconds)] for a in run_apps}
    tau_u = {a: {o: v["tau_us"] for o, v in rs[0]["operators"].items()} for a, rs in unlimited.items()}
    reps, points, costs_docs = [], [], []
    for k in range(args.repeat):
        calib, val, ref = interleaved_repeat(run_apps, workers, cpu, args.seconds, k, placed, args.speed_reference)
        doc, sims = predictions(apps, workers, calib, 1, placed, tau_u, args)
        sim = sims[""]
        coeff = _coefficients(doc)
        print(json.dumps({"repeat": k, "costs": coeff}), flush=True)
        costs_docs.append(coeff)
        reps.append((calib, val, ref))
        for app in apps:
            for n in workers:
                e = val[(app, n)]["throughput"]
                p = {"repeat": k, "app": app, "workers": n, "role": "fitted" if n == 1 else "validated",
                     "emulated": round(e, 1), "simulated": round(sim[(app, n)], 1),
                     **{"ratio" + (f"_{v}" if v else ""): round(t[(app, n)] / e, 4) for v, t in sims.items()},
                     "ratio_speed_reference": _speed_ratio(sim, [ref[(app, n)]["throughput"]] if (app, n) in ref
                                                           else [], e, app, n)} | {
                         k2: v for k2, v in _brief(val[(app, n)]).items() if k2 != "throughput"}
                points.append(p)
                print(json.dumps(p), flush=True)
    # Pooled: every repeat's calibration runs, against the mean of the validation runs.
    pooled = {"one": {a: [r for c, _, _ in reps for r in c["one"][a]] for a in run_apps},
              "unlimited": unlimited,
              **{key: [r for c, _, _ in reps for r in c[key]]
                 for key in CALIB_RUNS}}
    doc, sims = predictions(apps, workers, pooled, args.repeat, placed, tau_u, args)
    sim = sims[""]
    pooled_points = []
    for app in apps:
        for n in workers:
            t = [v[(app, n)]["throughput"] for _, v, _ in reps]
            refs = [rf[(app, n)]["throughput"] for _, _, rf in reps if (app, n) in rf]
            mean = statistics.fmean(t)
            p = {"pooled": True, "app": app, "workers": n, "role": "fitted" if n == 1 else "validated",
                 "emulated": round(mean, 1), "emulated_runs": [round(x, 1) for x in t],
                 "emulated_min": min(t), "emulated_max": max(t), "spread": round((max(t) - min(t)) / mean, 4),
                 "simulated": round(sim[(app, n)], 1),
                 **{"ratio" + (f"_{v}" if v else ""): round(x[(app, n)] / mean, 4) for v, x in sims.items()},
                 "per_repeat_ratio": [q["ratio"] for q in points if q["app"] == app and q["workers"] == n],
                 "ratio_speed_reference": _speed_ratio(sim, refs, mean, app, n)}
            pooled_points.append(p)
            print(json.dumps({k2: v for k2, v in p.items() if k2 not in ("emulated_min", "emulated_max")}),
                  flush=True)
    if args.write_costs:
        out = Path(args.write_costs)
        old = json.loads(out.read_text()) if out.exists() else {}
        carried = sorted(set(old.get("tau_us", {})) - set(doc["tau_us"]))
        doc["tau_us"] = {**{a: old["tau_us"][a] for a in carried}, **doc["tau_us"]}
        if carried:
            doc["measured"]["tau_us_carried_over"] = {
                "apps": carried, "from": old.get("measured", {}).get("date"),
                "note": "not measured in this run; their tau include the older file's epsilon"}
        doc["measured"]["how"] += "; python -m clasp.bench.validate_sim (interleaved, pooled over repeats)"
        Costs.from_json_dict(doc)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    per_app = {}
    for app in apps:
        val_pts = [p for p in points if p["app"] == app and p["role"] == "validated"]
        pool_pts = [p for p in pooled_points if p["app"] == app and p["role"] == "validated"]
        per_app[app] = {
            "max_abs_error_per_repeat": [round(max((abs(p["ratio"] - 1) for p in val_pts if p["repeat"] == k),
                                                   default=0.0), 4) for k in range(args.repeat)],
            "max_abs_error_pooled": round(max((abs(p["ratio"] - 1) for p in pool_pts), default=0.0), 4),
            "max_abs_error_pooled_no_split": round(max((abs(p["ratio_no_split"] - 1) for p in pool_pts),
                                                       default=0.0), 4),
            **{f"max_abs_error_pooled_{v}": round(max(abs(p[f"ratio_{v}"] - 1) for p in pool_pts), 4)
               for v in ("pipe_beta", "alt_beta", "mix_split", "split_split")
               if pool_pts and f"ratio_{v}" in pool_pts[0]},
            "max_abs_error_pooled_speed_reference": round(max(abs(p["ratio_speed_reference"] - 1) for p in ref_pts), 4)
            if (ref_pts := [p for p in pool_pts if p["ratio_speed_reference"] is not None]) else None,
            "max_abs_error_fitted_1w": round(max(abs(p["ratio"] - 1) for p in points
                                                 if p["app"] == app and p["role"] == "fitted"), 4)
            if 1 in workers else None}
    allv = [p for p in points if p["role"] == "validated"] + [p for p in pooled_points if p["role"] == "validated"]
    worst = max(allv, key=lambda p: abs(p["ratio"] - 1)) if allv else None
    summary = {"summary": True, "mode": "interleaved", "date": datetime.date.today().isoformat(),
               "cpu_per_worker": cpu, "apps": apps, "workers": workers, "repeat": args.repeat,
               "seconds": args.seconds, "gamma_rule": doc["measured"].get("gamma_rule"),
               "beta_rule": doc["measured"].get("beta_rule"),
               "alpha_split_rule": doc["measured"].get("alpha_split_rule"),
               "costs_per_repeat": costs_docs,
               "costs_pooled": _coefficients(doc),
               "per_app": per_app,
               "max_abs_error": round(abs(worst["ratio"] - 1), 4) if worst else 0.0,
               "worst": {"app": worst["app"], "workers": worst["workers"], "repeat": worst.get("repeat", "pooled")}
               if worst else None,
               "within_15pct": {app: all(abs(p["ratio"] - 1) <= TOLERANCE for p in allv if p["app"] == app)
                                for app in apps}}
    print(json.dumps(summary), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"points": points, "pooled": pooled_points, "summary": summary},
                                              indent=1))
    if args.plot:
        plot(args.plot, apps, workers, pooled_points,
             f"emulated ({cpu} CPU/worker, {args.repeat} interleaved repeats) vs simulated (pooled calibration)")
    return 0 if all(summary["within_15pct"].values()) else 1


def _run_unlimited(app: str, seconds: float) -> dict:
    r = ce.unthrottled(app, 1, seconds=min(seconds, 5.0))
    print(json.dumps({"run": "unlimited", "app": app, "throughput": round(r["throughput"], 1)}), file=sys.stderr,
          flush=True)
    return r


def emulated(apps: list[str], workers: list[int], cpu: float, repeat: int, seconds: float,
             placed: dict | None = None) -> dict:
    out: dict[tuple[str, int], list[dict]] = {}
    for n in workers:
        for _ in range(repeat):
            for app in apps:
                r = ce.unthrottled(app, n, placement=_fractions(placed, app, n), cpu_per_worker=cpu, seconds=seconds)
                if not r["correct"]:
                    raise ce.EngineError(f"{app} on {n} workers gave a wrong answer")
                out.setdefault((app, n), []).append(r)
                print(json.dumps({"measured": app, "workers": n, "throughput": round(r["throughput"], 1),
                                  "window_s": r["seconds"]}), file=sys.stderr, flush=True)
        ce.shutdown()
    return out


REFERENCE = "one-worker reference"


def emulated_policies(apps: list[str], workers: list[int], cpu: float | None, repeat: int, seconds: float,
                      placed: dict[str, dict], reference: bool = False) -> dict[tuple[str, str, int], list[dict]]:
    """Every policy's placement on one cluster per worker count, policies and apps interleaved within each
    repeat, so that the host's drift hits every policy alike. With `reference`, each repeat of an app starts
    with the app on one of the cluster's workers (key REFERENCE): the host's speed at that moment."""
    out: dict[tuple[str, str, int], list[dict]] = {}
    for n in workers:
        for _ in range(repeat):
            for app in apps:
                if reference:
                    one = {o: {0: 1.0} for o in _operators(app)}
                    r = ce.unthrottled(app, n, placement=one, cpu_per_worker=cpu, seconds=seconds)
                    out.setdefault((REFERENCE, app, n), []).append(r)
                    print(json.dumps({"measured": app, "policy": REFERENCE, "workers": n,
                                      "throughput": round(r["throughput"], 1)}), file=sys.stderr, flush=True)
                for policy, by_point in placed.items():
                    r = ce.unthrottled(app, n, placement=_fractions(by_point, app, n), cpu_per_worker=cpu,
                                       seconds=seconds)
                    if not r["correct"]:
                        raise ce.EngineError(f"{app} on {n} workers under {policy} gave a wrong answer")
                    out.setdefault((policy, app, n), []).append(r)
                    print(json.dumps({"measured": app, "policy": policy, "workers": n,
                                      "throughput": round(r["throughput"], 1)}), file=sys.stderr, flush=True)
        ce.shutdown()
    return out


def _tiers(row: dict[str, dict], key: str) -> list[list[str]]:
    """Policies from best to worst by `key`; within 3 % of each other they tie (-SP variants place alike)."""
    groups: list[list[str]] = []
    for q in sorted(row, key=lambda q: -row[q][key]):
        if groups and row[groups[-1][0]][key] <= row[q][key] * 1.03:
            groups[-1].append(q)
        else:
            groups.append([q])
    return groups


# Across policies (docs/results-log.md, "simulator vs emulated cluster"): each policy's simulated/emulated within 20 %.
POLICY_TOLERANCE = 0.20


def compare_policies(args, apps: list[str], workers: list[int], costs, cpu: float | None) -> int:
    """`--placement P1,P2,...`: each policy's placement in both engines, ratios and rankings side by side."""
    policies = [p.strip() for p in args.placement.split(",") if p.strip()]
    # Planned on the file being validated: each policy plans with the costs the simulator charges.
    placed = {p: placements(apps, workers, p, Path(args.costs), costs) for p in policies}
    sim_detail: dict[str, dict] = {p: {} for p in policies}
    sim = {p: simulated(apps, workers, costs, placed[p], host_cpus=args.host_cpus, detail=sim_detail[p])
           for p in policies}
    emu = emulated_policies(apps, workers, cpu, args.repeat, args.seconds, placed, args.speed_reference)
    one = simulated(apps, [1], costs, host_cpus=args.host_cpus) if args.speed_reference else {}
    points, rankings = [], []
    for app in apps:
        for n in workers:
            row = {}
            for policy in policies:
                t = [r["throughput"] for r in emu[(policy, app, n)]]
                mean = statistics.fmean(t)
                p = {"app": app, "workers": n, "policy": policy, "emulated": round(mean, 1),
                     "emulated_runs": [round(x, 1) for x in t], "simulated": round(sim[policy][(app, n)], 1),
                     "ratio": round(sim[policy][(app, n)] / mean, 4),
                     # Where the two engines part: CPU per worker, per record, and messages per record.
                     "emulated_detail": [_brief(r) for r in emu[(policy, app, n)]],
                     "simulated_detail": sim_detail[policy][(app, n)]}
                if args.speed_reference:
                    # Scaled to the host's speed at the time: the reference runs' mean over the simulated one worker.
                    ref = statistics.fmean(r["throughput"] for r in emu[(REFERENCE, app, n)])
                    p["reference"] = round(ref, 1)
                    p["ratio_speed_reference"] = round(sim[policy][(app, n)] / one[(app, 1)] * ref / mean, 4)
                points.append(p)
                row[policy] = p
                print(json.dumps(p), flush=True)
                # The planner's online estimate at the end of each run (what it identified and what it held).
                p["online"] = [r.get("model") for r in emu[(policy, app, n)]]
            em, sm = _tiers(row, "emulated"), _tiers(row, "simulated")
            pos = {q: i for i, g in enumerate(em) for q in g}
            spos = {q: i for i, g in enumerate(sm) for q in g}
            agree = all((pos[a] < pos[b]) <= (spos[a] <= spos[b]) and (spos[a] < spos[b]) <= (pos[a] <= pos[b])
                        for a in policies for b in policies)
            rankings.append({"app": app, "workers": n, "emulated": em, "simulated": sm, "same_ranking": agree})
            print(json.dumps(rankings[-1]), flush=True)
    worst = max(points, key=lambda p: abs(p["ratio"] - 1))
    summary = {"summary": True, "date": datetime.date.today().isoformat(), "cpu_per_worker": cpu,
               "costs": args.costs, "apps": apps, "workers": workers, "policies": policies,
               "repeat": args.repeat, "seconds": args.seconds, "max_abs_error": round(abs(worst["ratio"] - 1), 4),
               "worst": {k: worst[k] for k in ("app", "workers", "policy")},
               "within_20pct": all(abs(p["ratio"] - 1) <= POLICY_TOLERANCE for p in points),
               "within_20pct_speed_reference": (all(abs(p["ratio_speed_reference"] - 1) <= POLICY_TOLERANCE
                                                    for p in points) if args.speed_reference else None),
               "same_rankings": all(r["same_ranking"] for r in rankings)}
    print(json.dumps(summary), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"points": points, "rankings": rankings, "summary": summary},
                                              indent=1))
    return 0 if summary["within_20pct"] and summary["same_rankings"] else 1


def plot(path: str, apps: list[str], workers: list[int], points: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, rx) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    for i, app in enumerate(apps):
        rows = [p for p in points if p["app"] == app]
        x = [p["workers"] for p in rows]
        ax.errorbar(x, [p["emulated"] for p in rows],
                    yerr=[[max(0.0, p["emulated"] - p["emulated_min"]) for p in rows],
                          [max(0.0, p["emulated_max"] - p["emulated"]) for p in rows]],
                    color=f"C{i}", marker="o", label=f"{app} emulated", capsize=3)
        ax.plot(x, [p["simulated"] for p in rows], color=f"C{i}", ls="--", marker="s", label=f"{app} simulated")
        rx.plot(x, [p["ratio"] for p in rows], color=f"C{i}", marker="o", label=app)
    ax.set_xlabel("workers")
    ax.set_ylabel("throughput, records/s (WC: lines/s)")
    ax.set_xticks(workers)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    rx.axhspan(1 - TOLERANCE, 1 + TOLERANCE, color="grey", alpha=0.15, label=f"±{TOLERANCE:.0%}")
    rx.axhline(1.0, color="grey", lw=0.8)
    rx.set_xlabel("workers")
    rx.set_ylabel("simulated / emulated")
    rx.set_xticks(workers)
    rx.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    from clasp.sim.simulator import Costs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-per-worker", type=float, default=None,
                    help="CPU quota per worker (default: the cost file's measured quota)")
    ap.add_argument("--apps", default="wc,syn")
    ap.add_argument("--workers", default="1,2,3,4,5")
    ap.add_argument("--repeat", type=int, default=2, help="emulated runs per point")
    ap.add_argument("--seconds", type=float, default=20.0,
                    help="seconds per emulated run (20: a 6 s run varies 12 %% from run to run, a 20 s one 6 %%)")
    ap.add_argument("--costs", help="validate this cost file as given (no interleaved calibration)")
    ap.add_argument("--write-costs", default=None,
                    help=f"interleaved: write the pooled calibration here (e.g. {COSTS}; default: not written)")
    ap.add_argument("--fit-gamma", action="store_true",
                    help="interleaved: also fit γ on FAN when message_us is fitted (the old rule; default γ = 0)")
    ap.add_argument("--placement", default="clasp",
                    help="both engines run this policy's placement for n workers (the figures' placements), or "
                         "`spread`, every operator over all n (the worst case for chaining); with --costs a "
                         "comma-separated list of policies compares them: ratios and rankings side by side")
    ap.add_argument("--beta-from", choices=("alt", "pipe"), default="alt",
                    help="interleaved: fit β on ALT (receive share 0.5) or β and the share on PIPE (docs/SIMULATOR.md)")
    ap.add_argument("--alpha-split-from", choices=("split", "mix"), default="split",
                    help="interleaved: the run α_split is fitted on (mix: a check only, docs/SIMULATOR.md)")
    ap.add_argument("--speed-reference", action="store_true",
                    help="interleaved: before each validation run of n ≥ 2 workers, the app on one of them (with "
                         "--costs and several --placement policies: before each app's repeat), and report "
                         "ratio_speed_reference: the simulation scaled to the host's speed at the time")
    ap.add_argument("--host-cpus", type=float, default=HOST_CPUS,
                    help="CPUs the simulated planner, client and workers share, as the emulated cluster's "
                         "processes share this host (default: this host's; 0: each its own)")
    ap.add_argument("--plot", default="out/validate_sim.png")
    ap.add_argument("--json", help="also write every point here")
    args = ap.parse_args(argv)
    apps = [a.strip() for a in args.apps.split(",") if a.strip()]
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    if args.costs is None:
        if args.cpu_per_worker is None:
            args.cpu_per_worker = json.loads(COSTS.read_text()).get("measured", {}).get("cpu_per_worker", 0.25) \
                if COSTS.exists() else 0.25
        return interleaved(args, apps, workers, args.cpu_per_worker)
    costs = Costs.load(args.costs)
    meta = json.loads(Path(args.costs).read_text()).get("measured", {})
    cpu = args.cpu_per_worker if args.cpu_per_worker is not None else meta.get("cpu_per_worker")
    if cpu is None:
        ap.error("give --cpu-per-worker (the cost file does not say which quota it was measured under)")
    if meta.get("cpu_per_worker") not in (None, cpu):
        # W is the work one worker does per second: under another quota it scales with the quota (τ̄, α, β
        # and μ are per request and per message, and stay).
        scaled = costs.capacity * cpu / meta["cpu_per_worker"]
        print(f"{args.costs} was measured at {meta['cpu_per_worker']} CPU per worker: W scaled to {cpu} CPU, "
              f"{costs.capacity:.0f} -> {scaled:.0f} µs/s", file=sys.stderr)
        costs = dataclasses.replace(costs, capacity=scaled)
    if "," in args.placement:
        return compare_policies(args, apps, workers, costs, cpu)
    placed = placements(apps, workers, args.placement)
    sim = simulated(apps, workers, costs, placed, host_cpus=args.host_cpus)
    emu = emulated(apps, workers, cpu, args.repeat, args.seconds, placed)
    points = []
    for app in apps:
        for n in workers:
            t = [r["throughput"] for r in emu[(app, n)]]
            mean = statistics.fmean(t)
            p = {"app": app, "workers": n, "emulated": round(mean, 1), "emulated_runs": [round(x, 1) for x in t],
                 "emulated_min": min(t), "emulated_max": max(t), "spread": round((max(t) - min(t)) / mean, 4),
                 "simulated": round(sim[(app, n)], 1), "ratio": round(sim[(app, n)] / mean, 4)}
            points.append(p)
            print(json.dumps({k: v for k, v in p.items() if k not in ("emulated_min", "emulated_max")}), flush=True)
    worst = max(points, key=lambda p: abs(p["ratio"] - 1))
    summary = {"summary": True, "date": datetime.date.today().isoformat(), "cpu_per_worker": cpu,
               "costs": args.costs, "apps": apps, "workers": workers, "repeat": args.repeat,
               "seconds": args.seconds, "max_abs_error": round(abs(worst["ratio"] - 1), 4),
               "worst": {"app": worst["app"], "workers": worst["workers"]},
               "max_spread": max(p["spread"] for p in points),
               "within_15pct": all(abs(p["ratio"] - 1) <= TOLERANCE for p in points)}
    print(json.dumps(summary), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"points": points, "summary": summary}, indent=1))
    if args.plot:
        plot(args.plot, apps, workers, points,
             f"emulated ({cpu} CPU/worker) vs simulated, unthrottled, {args.placement} placement")
    return 0 if summary["within_15pct"] else 1


if __name__ == "__main__":
    sys.exit(main())
