"""Extraction, Transform and Load (ETL), after RIoTBench's ETL dataflow, on SenML IoT messages.

parse → range filter → bloom filter★ → interpolate★ → join★ → annotate ─→ csv2senml → publish ─┐
                                                                       └→ table insert ────────┴→ sink

`parse` splits a SenML message into one observation per field; `range_filter` blanks values outside the
field's physical range; `bloom_filter` (state per field: its Bloom filter of registered sensors, plus
pass/reject counters) marks observations from sensors not registered for that field; `interpolate`
(state per sensor and field) fills a blank value with the mean of its two neighbours in sequence;
`join` (state per message) reassembles a message's observations; `annotate` adds the sensor's metadata
and renders a CSV row; `csv2senml` turns it back into SenML for `publish` (an MQTT topic and payload);
`table_insert` builds the row of a table store; `sink` records a digest of each.

Observations that are blanked or rejected still travel (value None) so the join knows when a message
is complete. Interpolation emits a blank value once both neighbours have arrived, whichever comes last,
so the answer does not depend on arrival order.
"""

from __future__ import annotations

import hashlib
import json
import random
import zlib

import numpy as np

import clasp

NAME = "etl"
N_SENSORS = 40
FIELDS = {  # field -> (unit, valid range, typical value, noise)
    "temperature": ("Cel", (-40.0, 60.0), 22.0, 3.0),
    "humidity": ("%RH", (0.0, 100.0), 55.0, 8.0),
    "light": ("lx", (0.0, 5000.0), 800.0, 150.0),
    "dust": ("ug/m3", (0.0, 1000.0), 35.0, 10.0),
    "airquality": ("ppm", (0.0, 2000.0), 420.0, 40.0),
}
BLOOM_BITS = 512
BLOOM_HASHES = 3
_CITIES = ["Bangalore", "Chennai", "Delhi", "Mumbai", "Pune"]


def _registry() -> tuple[dict[str, list[int]], dict[int, dict]]:
    # Which sensors are registered for which field (~80%), and each sensor's metadata: shipped with the app.
    rng = random.Random("etl-registry")
    reg = {f: [s for s in range(N_SENSORS) if rng.random() < 0.8] for f in FIELDS}
    meta = {s: {"city": rng.choice(_CITIES), "owner": f"org{rng.randint(1, 6)}", "floor": rng.randint(0, 9)}
            for s in range(N_SENSORS + 8)}
    return reg, meta


REGISTERED, METADATA = _registry()


def _positions(sensor: int) -> list[int]:
    h = hashlib.blake2b(str(sensor).encode(), digest_size=4 * BLOOM_HASHES).digest()
    return [int.from_bytes(h[4 * i:4 * i + 4], "little") % BLOOM_BITS for i in range(BLOOM_HASHES)]


def bloom_bits(field: str) -> bytes:
    """The Bloom filter of the sensors registered for `field`."""
    bits = bytearray(BLOOM_BITS // 8)
    for s in REGISTERED[field]:
        for p in _positions(s):
            bits[p >> 3] |= 1 << (p & 7)
    return bytes(bits)


def bloom_contains(bits: bytes, sensor: int) -> bool:
    return all(bits[p >> 3] & (1 << (p & 7)) for p in _positions(sensor))


def parse(text: str) -> list[dict]:
    msg = json.loads(text)
    sensor, seq = (int(x) for x in msg["bn"].split(":")[2:4])
    es = msg["e"]
    return [{"m": f"{sensor}:{seq}", "s": sensor, "q": seq, "t": msg["bt"], "n": len(es), "f": e["n"],
             "v": e.get("v")} for e in es]


def in_range(field: str, v: float | None) -> bool:
    lo, hi = FIELDS[field][1]
    return v is not None and lo <= v <= hi


def range_filter(ob: dict) -> dict:
    if ob["v"] is not None and not in_range(ob["f"], ob["v"]):
        ob["v"] = None
    return ob


def bloom_filter(state: dict | None, ob: dict) -> tuple[dict, dict]:
    state = state or {"bits": bloom_bits(ob["f"]), "pass": 0, "reject": 0}
    if bloom_contains(state["bits"], ob["s"]):
        state["pass"] += 1
    else:
        state["reject"] += 1
        ob["x"] = 1
        ob["v"] = None
    return state, ob


def _mean(a: float, b: float) -> float:
    return round((a + b) / 2, 3)


def interpolate(state: dict | None, ob: dict) -> tuple[dict | None, list]:
    # "lw": every seq <= lw has arrived; "a": arrived seqs beyond it; "v": valid values still needed by a
    # possibly blank neighbour; "m": blank observations waiting for a neighbour.
    if "x" in ob:
        return state, [ob]
    st = state or {"lw": -1, "a": [], "v": {}, "m": {}}
    q = ob["q"]
    v, m = st["v"], st["m"]
    out = []
    if ob["v"] is not None:
        v[str(q)] = ob["v"]
        out.append(ob)
        for t in (q - 1, q + 1):
            w = m.get(str(t))
            if w is not None and str(t - 1) in v and str(t + 1) in v:
                w["v"] = _mean(v[str(t - 1)], v[str(t + 1)])
                out.append(w)
                del m[str(t)]
    elif str(q - 1) in v and str(q + 1) in v:
        ob["v"] = _mean(v[str(q - 1)], v[str(q + 1)])
        out.append(ob)
    else:
        m[str(q)] = ob
    a = st["a"]
    a.append(q)
    a.sort()
    while a and a[0] == st["lw"] + 1:
        st["lw"] = a.pop(0)
    lw = st["lw"]
    # Both neighbours of s have arrived and neither waits: nothing can need v[s] again.
    for k in [k for k in v if int(k) + 1 <= lw and str(int(k) - 1) not in m and str(int(k) + 1) not in m]:
        del v[k]
    # A blank whose neighbours have both arrived but not both valid can never be filled.
    for k in [k for k in m if int(k) + 1 <= lw]:
        del m[k]
    return st, out


def join(state: dict | None, ob: dict) -> tuple[dict | None, dict | None]:
    fields = state or {}
    fields[ob["f"]] = ob["v"]
    if len(fields) < ob["n"]:
        return fields, None
    return None, {"m": ob["m"], "s": ob["s"], "q": ob["q"], "t": ob["t"], "o": fields}


def csv_row(rec: dict) -> str:
    meta = METADATA.get(rec["s"], {"city": "unknown", "owner": "none", "floor": 0})
    vals = ";".join(f"{f}={rec['o'][f]}" for f in sorted(rec["o"]) if rec["o"][f] is not None)
    head = f"{rec['m']},{rec['s']},{rec['q']},{rec['t']}"
    return f"{head},{meta['city']},{meta['owner']},{meta['floor']},{vals}"


def annotate(rec: dict) -> str:
    return csv_row(rec)


def senml_of(row: str) -> str:
    mid, sensor, seq, bt, city, owner, floor, vals = row.split(",", 7)
    es = []
    for kv in vals.split(";") if vals else []:
        f, x = kv.split("=")
        es.append({"n": f, "u": FIELDS[f][0], "v": float(x)})
    return json.dumps({"bn": f"urn:dev:{sensor}:{seq}:", "bt": int(bt), "city": city, "owner": owner,
                       "floor": int(floor), "e": es}, sort_keys=True)


def csv2senml(row: str) -> str:
    return senml_of(row)


def publish(senml: str) -> list:
    msg = json.loads(senml)
    return [[f"etl/{msg['city']}/{msg['bn'].split(':')[2]}", senml]]


def table_row(row: str) -> dict:
    mid, sensor, seq, bt, city, owner, floor, vals = row.split(",", 7)
    rec = {"PartitionKey": city, "RowKey": mid, "Timestamp": int(bt), "Owner": owner, "Floor": int(floor)}
    for kv in vals.split(";") if vals else []:
        f, x = kv.split("=")
        rec[f] = float(x)
    return rec


def table_insert(row: str) -> dict:
    return table_row(row)


def digest(kind: str, key: str, body: str) -> list:
    return [kind, key, zlib.crc32(body.encode())]


def sink(item: list | dict) -> list:
    if isinstance(item, dict):
        return [digest("row", item["RowKey"], json.dumps(item, sort_keys=True))]
    topic, payload = item
    return [digest("pub", topic, payload)]


def field_key(ob: dict) -> str:
    return ob["f"]


def series_key(ob: dict) -> str:
    return f"{ob['s']}|{ob['f']}"


def message_key(ob: dict) -> str:
    return ob["m"]


def build_dag() -> clasp.Dag:
    dag = clasp.Dag(NAME)
    ann = dag.operator("annotate", annotate)
    snk = dag.operator("sink", sink, collect=True)
    (dag.operator("parse", parse)
     >> dag.operator("range_filter", range_filter)
     >> dag.operator("bloom_filter", bloom_filter, stateful=True, key=field_key)
     >> dag.operator("interpolate", interpolate, stateful=True, key=series_key)
     >> dag.operator("join", join, stateful=True, key=message_key)
     >> ann)
    ann >> dag.operator("csv2senml", csv2senml) >> dag.operator("publish", publish) >> snk
    ann >> dag.operator("table_insert", table_insert) >> snk
    return dag


def generate(n: int, seed: int) -> list[str]:
    """`n` SenML messages from N_SENSORS sensors (+ a few unknown ones), seq counting per sensor.

    ~3% of values are missing and ~2% glitch out of range; never two in a row of one sensor's field, nor
    at its first or last message, so every blank has two valid neighbours to interpolate from.
    """
    rng = np.random.default_rng(seed)
    sensors = rng.integers(0, N_SENSORS + 4, size=n).tolist()
    last = {s: i for i, s in enumerate(sensors)}
    noise = rng.normal(0.0, 1.0, size=(n, len(FIELDS))).tolist()
    roll = rng.random((n, len(FIELDS))).tolist()
    seqs: dict[int, int] = {}
    prev_bad: set[tuple[int, str]] = set()
    out = []
    for i, s in enumerate(sensors):
        q = seqs.get(s, 0)
        seqs[s] = q + 1
        es = []
        for j, (f, (unit, _, typical, sd)) in enumerate(FIELDS.items()):
            e = {"n": f, "u": unit}
            r = roll[i][j]
            edge = q == 0 or last[s] == i or (s, f) in prev_bad
            prev_bad.discard((s, f))
            if not edge and r < 0.03:
                prev_bad.add((s, f))
            else:
                e["v"] = -999.0 if not edge and r < 0.05 else round(typical + sd * noise[i][j], 2)
                if e["v"] == -999.0:
                    prev_bad.add((s, f))
            es.append(e)
        out.append(json.dumps({"bn": f"urn:dev:{s}:{q}:", "bt": 1_700_000_000 + i, "e": es}))
    return out


def expected(records: list[str]) -> list[list]:
    """The sorted sink digests, by a plain two-pass computation over the messages."""
    msgs = [json.loads(t) for t in records]
    series: dict[tuple[int, str], dict[int, float | None]] = {}
    for msg in msgs:
        sensor, seq = (int(x) for x in msg["bn"].split(":")[2:4])
        for e in msg["e"]:
            v = e.get("v")
            series.setdefault((sensor, e["n"]), {})[seq] = v if in_range(e["n"], v) else None
    # What the Bloom filter lets through: the registered sensors and its false positives.
    registered = {f: {s for s in range(N_SENSORS + 8) if bloom_contains(bloom_bits(f), s)} for f in FIELDS}
    out = []
    for msg in msgs:
        sensor, seq = (int(x) for x in msg["bn"].split(":")[2:4])
        fields: dict[str, float | None] = {}
        complete = True
        for e in msg["e"]:
            f = e["n"]
            if sensor not in registered[f]:
                fields[f] = None
                continue
            s = series[(sensor, f)]
            v = s[seq]
            if v is None:
                a, b = s.get(seq - 1), s.get(seq + 1)
                if a is None or b is None:
                    complete = False
                    break
                v = _mean(a, b)
            fields[f] = v
        if not complete:
            continue
        row = csv_row({"m": f"{sensor}:{seq}", "s": sensor, "q": seq, "t": msg["bt"], "o": fields})
        senml = senml_of(row)
        out.append(digest("pub", f"etl/{json.loads(senml)['city']}/{sensor}", senml))
        out.append(digest("row", f"{sensor}:{seq}", json.dumps(table_row(row), sort_keys=True)))
    return sorted(out)


def result(job) -> list[list]:
    return sorted(list(x) for x in job.collected("sink"))
