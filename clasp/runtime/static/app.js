// The clasp dashboard: no build step, no library. Updates come as server-sent events from /api/stream
// (one a second); where EventSource fails, the page polls /api/cluster, /api/jobs and /api/jobs/ID.
// Large parts (the DAG's drawing, the placement matrix) are rebuilt only when their shape changes; a
// tick only rewrites numbers, so 100 workers and 50 operators stay cheap to show.
"use strict";

const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const fmt = (v, d = 0) => (v === null || v === undefined || Number.isNaN(v)) ? "–" :
  Number(v).toLocaleString("en-US", { maximumFractionDigits: d, minimumFractionDigits: d });
const ms = (s) => s === null || s === undefined ? "–" : fmt(s * 1e3, 1);

const state = { route: "cluster", job: null, cluster: null, jobs: [], jobData: null, mode: null, es: null, timer: null,
  dagKey: null, matrixKey: null };

// ------------------------------------------------------------------ routing
function parseRoute() {
  const m = location.hash.match(/^#\/job\/(\d+)/);
  if (m) { state.route = "job"; state.job = m[1]; } else { state.route = "cluster"; state.job = null; }
}
function showRoute() {
  $("view-cluster").hidden = state.route !== "cluster";
  $("view-job").hidden = state.route !== "job";
  $("nav-cluster").classList.toggle("active", state.route === "cluster");
  document.querySelectorAll("#nav-jobs a").forEach((a) => a.classList.toggle("active", a.dataset.job === state.job));
}
window.addEventListener("hashchange", () => { parseRoute(); showRoute(); state.dagKey = state.matrixKey = null; state.jobData = null; connect(); });

// ------------------------------------------------------------------ transport
function connect() {
  if (state.es) { state.es.close(); state.es = null; }
  if (state.timer) { clearInterval(state.timer); state.timer = null; }
  if (window.EventSource && !location.search.includes("poll")) {
    const es = new EventSource("/api/stream" + (state.job ? "?job=" + state.job : ""));
    state.es = es;
    es.addEventListener("update", (ev) => { setMode("sse"); apply(JSON.parse(ev.data)); });
    es.onerror = () => { if (es.readyState === EventSource.CLOSED || state.mode !== "sse") { es.close(); state.es = null; startPolling(); } else setMode("down"); };
  } else startPolling();
}
function startPolling() {
  if (state.timer) return;
  const tick = async () => {
    try {
      const get = (u) => fetch(u, { cache: "no-store" }).then((r) => r.ok ? r.json() : null);
      const [cluster, jobs, job] = await Promise.all([get("/api/cluster"), get("/api/jobs"), state.job ? get("/api/jobs/" + state.job) : null]);
      setMode("poll"); apply({ cluster, jobs, job });
    } catch (e) { setMode("down"); }
  };
  tick(); state.timer = setInterval(tick, 1000);
}
function setMode(m) {
  if (state.mode === m) return;
  state.mode = m;
  const el = $("live");
  el.className = "live " + m;
  el.textContent = { sse: "live (server-sent events)", poll: "live (polling)", down: "disconnected" }[m];
}

// ------------------------------------------------------------------ apply an update
function apply(u) {
  if (u.cluster) { state.cluster = u.cluster; renderPlanner(u.cluster); }
  if (u.jobs) { state.jobs = u.jobs; renderNav(u.jobs); }
  if (state.route === "cluster" && state.cluster) renderCluster(state.cluster, state.jobs);
  if (state.route === "job") {
    if (u.job) { state.jobData = u.job; renderJob(u.job); }
    else if (u.job === null) $("job-cards").innerHTML = `<div class="card"><div class="k">job ${esc(state.job)}</div><div class="v">not found</div></div>`;
  }
}

function renderPlanner(c) {
  const p = c.planner || {};
  $("planner").textContent = `planner ${p.id || ""} · ${p.endpoint || ""} · CURVE ${p.curve ? "on" : "off"} · up ${fmt(p.uptime_s)} s`;
}
function renderNav(jobs) {
  const key = jobs.map((j) => j.job + j.name).join();
  const nav = $("nav-jobs");
  if (nav.dataset.key !== key) {
    nav.dataset.key = key;
    nav.innerHTML = jobs.map((j) => `<a href="#/job/${j.job}" data-job="${j.job}">job ${j.job} · ${esc(j.name)}</a>`).join("");
    showRoute();
  }
}
const card = (k, v, id) => `<div class="card"${id ? ` id="${id}"` : ""}><div class="k">${k}</div><div class="v">${v}</div></div>`;

// ------------------------------------------------------------------ cluster view
function renderCluster(c, jobs) {
  const n = c.counts || {}, p = c.planner || {};
  $("cluster-cards").innerHTML = [
    card("workers", fmt(c.workers_total), "cluster-workers"), card("alive", fmt(n.alive)), card("joining", fmt(n.joining)),
    card("draining", fmt(n.draining)), card("dead", fmt(n.dead)), card("jobs", fmt(c.jobs)),
    card("input rate req/s", fmt(p.input_rate)), card("throughput req/s", fmt(p.throughput), "cluster-throughput"),
    card("planner queue", fmt(p.queue)), card("migrations", fmt(p.rescales)), card("records lost", fmt(p.records_lost)),
  ].join("");
  $("workers").tBodies[0].innerHTML = c.workers.map((w) => {
    const ratio = w.capacity ? w.load / w.capacity : 0;
    return `<tr><td>${esc(w.id)}</td><td><span class="status ${esc(w.status)}">${esc(w.status)}</span></td>` +
      `<td class="num">${fmt(w.queue)}</td><td class="num">${w.cpu === null ? "–" : fmt(w.cpu, 2)}${w.cpus ? " / " + fmt(w.cpus, 1) : ""}${w.cpu_bound ? " ⚑" : ""}</td>` +
      `<td class="num">${fmt(w.capacity)}</td><td class="num">${fmt(w.load)}</td>` +
      `<td><div class="bar" title="${fmt(ratio * 100, 1)} %"><i class="${ratio > 0.95 ? "hot" : ""}" style="width:${Math.min(ratio, 1) * 100}%"></i></div></td>` +
      `<td>${w.jobs.map((j) => `<a href="#/job/${j}">${j}</a>`).join(" ")}</td><td class="num">${fmt(w.last_seen_s, 1)} s ago</td></tr>`;
  }).join("");
  $("models").innerHTML = c.models.length ? c.models.map((m) => {
    const rows = [["α", "alpha", "µs per local chained request"], ["β_s", "beta", "µs per remote request sent"],
      ["β_r", "beta_receive", "µs per remote request received"], ["μ", "mu", "µs per data message"],
      ["γ", "gamma", "µs/s per remote destination"], ["W̄", "capacity", "µs/s a worker sustains"],
      ["flush delay", "flush_delay", "s"]];
    const terms = m.terms || {};
    const term = (k) => { const t = terms[k] ?? terms[k === "beta" ? "remote_out" : k === "beta_receive" ? "remote_in" : k === "alpha" ? "local" : k === "gamma" ? "destinations" : k === "mu" ? "messages" : k]; return t === undefined ? "" : t; };
    return `<h3>job ${m.job} · ${esc(m.name)} <span class="muted">${fmt(m.observations)} observations · ${esc(m.reason || "")}</span></h3>` +
      `<div class="scroll"><table class="coeffs"><thead><tr><th>coefficient</th><th>value</th><th>unit</th><th>identified?</th></tr></thead><tbody>` +
      rows.map(([sym, k, unit]) => { const t = term(k); return `<tr><td>${sym}</td><td class="num">${fmt(m[k], k === "flush_delay" ? 4 : 2)}</td><td>${unit}</td><td class="term ${t === "estimated" ? "estimated" : ""}">${esc(t)}</td></tr>`; }).join("") +
      Object.entries(terms).filter(([k]) => !["alpha", "beta", "beta_receive", "mu", "gamma", "capacity", "flush_delay", "local", "remote_out", "remote_in", "destinations", "messages"].includes(k))
        .map(([k, t]) => `<tr><td>${esc(k)}</td><td></td><td></td><td class="term ${t === "estimated" ? "estimated" : ""}">${esc(t)}</td></tr>`).join("") +
      `</tbody></table></div><p class="muted">W<sub>w</sub> per worker: ${Object.entries(m.capacities || {}).map(([w, v]) => `${esc(w)} ${fmt(v)}`).join(" · ") || "none apart from W̄"}; saturated: ${esc((m.saturated || []).join(", ") || "none")}</p>`;
  }).join("") : `<p class="muted">no job yet: the estimator runs per job</p>`;
}

// ------------------------------------------------------------------ job view
function renderJob(j) {
  const last = (j.latency && j.latency.last) || {};
  $("job-cards").innerHTML = [
    card("job", `${j.job} · ${esc(j.name)}`, "job-name"), card("throughput req/s", fmt(j.throughput), "job-throughput"),
    card("input rate req/s", fmt(j.input_rate)), card("workers", fmt(j.workers_active), "job-workers"),
    card("epoch", fmt(j.epoch)), card("p95 ms", ms(last.p95)), card("completed", fmt(j.completed), "job-completed"),
    card("queued", fmt(j.queued)), card("failed", fmt(j.failed)), card("lost", fmt(j.lost)),
    card("autoscale", j.autoscale ? "on" : "off"),
    ...eventTimeCards(j.event_time),
  ].join("");
  renderDag(j.graph, j.event_time);
  renderCharts(j.series || []);
  renderMatrix(j.matrix);
  $("decisions").tBodies[0].innerHTML = (j.decisions || []).slice().reverse().map((d) =>
    `<tr><td class="num">${fmt(d.t, 1)}</td><td class="wrap">${esc(d.trigger)}</td><td class="wrap">${d.change ? "" : "no change: "}${esc(d.reason)}</td>` +
    `<td class="num">${fmt(d.workers)}</td><td class="num">${fmt(d.result_workers)}</td><td class="num">${fmt(d.predicted_rate)}</td><td class="num">${fmt(d.result_throughput)}</td></tr>`).join("");
  $("migrations").tBodies[0].innerHTML = (j.migrations || []).slice().reverse().map((m) =>
    `<tr><td class="num">${m.epoch}</td><td class="num">${fmt(m.t, 1)}</td><td class="wrap">${esc(m.reason)}</td><td>${m.from_workers} → ${m.to_workers}</td>` +
    `<td class="num">${ms(m.duration_s)}</td><td class="num">${ms(m.max_pause_s)}</td><td class="num">${fmt(m.key_groups_moved)}</td><td class="num">${fmt(m.bytes)}</td>` +
    `<td>${Object.keys(m.failed || {}).length ? esc(Object.keys(m.failed).join(", ")) : ""}</td></tr>`).join("");
  $("errors").tBodies[0].innerHTML = (j.errors || []).slice().reverse().map((e) =>
    `<tr><td>${esc(e.worker)}</td><td>${esc(e.operator)}</td><td class="wrap">${esc(e.error)}</td><td class="wrap"><code>${esc(e.value)}</code></td></tr>`).join("");
  renderCheckpoints(j.checkpoints);
}

// Event time (docs/TIME.md, "In the runtime"): the watermark released to the workers, and the late records.
const wmText = (w) => w === null ? "none yet" : w === "end" ? "end of input" : fmt(w, 3);
function eventTimeCards(t) {
  if (!t) return [];
  return [card("watermark", wmText(t.watermark), "job-watermark"), card("windows fired", fmt(t.windows_fired)),
    card("late records", fmt(t.late), "job-late"), card("idle partitions", fmt((t.idle || []).length))];
}

// Checkpoints and recoveries: the job stats' "checkpoints" section (docs/RECOVERY.md, "Knobs, metrics, files").
function renderCheckpoints(c) {
  const cards = $("checkpoint-cards"), el = $("checkpoints");
  if (!c) {
    cards.innerHTML = "";
    el.className = "muted";
    el.textContent = "no checkpoints for this job: they are off (--checkpoint-interval 0) or its state is remote, so a dead worker's keyed state is lost";
    return;
  }
  cards.innerHTML = [
    card("checkpoints completed", fmt(c.completed), "ckpt-completed"), card("failed", fmt(c.failed), "ckpt-failed"),
    card("recoveries", fmt(c.recoveries), "ckpt-recoveries"), card("records replayed", fmt(c.replayed)),
    card("last checkpoint", c.last_id ? "#" + fmt(c.last_id) : "none yet"), card("its duration ms", ms(c.last_duration_s)),
    card("its bytes", fmt(c.last_bytes)), card("longest worker pause ms", ms(c.last_pause_s)),
    card("interval s", fmt(c.interval_s, 1)), card("input log records", fmt(c.input_log_records)),
  ].join("");
  const r = c.last_recovery;
  const lines = [c.pending ? `checkpoint #${fmt(c.pending)} in progress` : "no checkpoint in progress",
    r ? `last recovery at t = ${fmt(r.t, 1)} s: ${esc(r.cause)}; rolled back to checkpoint #${fmt(r.checkpoint)}, ` +
        `${fmt(r.replayed)} records replayed, ${ms(r.duration_s)} ms, epoch ${fmt(r.epoch)}` : "no recovery yet"];
  el.className = "";
  el.innerHTML = `<p class="muted" id="ckpt-status">${lines.join(" · ")}</p>` + ((c.failures || []).length ?
    `<div class="scroll"><table id="ckpt-failures"><thead><tr><th>failed checkpoints (last 10)</th></tr></thead><tbody>` +
    c.failures.slice().reverse().map((f) => `<tr><td class="wrap">${esc(f)}</td></tr>`).join("") + `</tbody></table></div>` : "");
}

// The DAG: operators in layers by longest path from a source, drawn once per shape; labels updated in place.
// A keyed time operator (windows, joins, timers: docs/TIME.md) has a fourth line, the watermark released to it.
const NODE_W = 150, GAP_X = 120, GAP_Y = 16;
let NODE_H = 54;
function renderDag(g, t) {
  if (!g) return;
  const wms = (t && t.operators) || {};
  const key = g.operators.map((o) => o.name).join("|") + "#" + g.edges.map((e) => e.src + ">" + e.dst).join("|") +
    "#" + Object.keys(wms).join("|");
  if (key !== state.dagKey) { state.dagKey = key; drawDag(g, wms); }
  for (const o of g.operators) {
    const n = state.dagNodes[o.name];
    if (!n) continue;
    n.stats.textContent = `${fmt(o.rate)} req/s · ${fmt(o.tau_us, 1)} µs`;
    n.errs.textContent = `${fmt(o.errors)} errors · queue ${fmt(o.queue)}`;
    if (o.name in wms) n.wm.textContent = `watermark ${wmText(wms[o.name])}`;
    n.g.classList.toggle("failing", o.errors > 0);
  }
  for (const e of g.edges) {
    const t = state.dagEdges[e.src + ">" + e.dst];
    if (t) t.textContent = `${fmt(e.local)} / ${fmt(e.remote)}`;
  }
}
function drawDag(g, wms) {
  NODE_H = Object.keys(wms).length ? 68 : 54;
  const layer = {}, preds = {};
  g.operators.forEach((o) => { preds[o.name] = []; });
  g.edges.forEach((e) => preds[e.dst] && preds[e.dst].push(e.src));
  const depth = (n, seen = new Set()) => {
    if (layer[n] !== undefined) return layer[n];
    if (seen.has(n)) return 0;
    seen.add(n);
    return (layer[n] = preds[n].length ? 1 + Math.max(...preds[n].map((p) => depth(p, seen))) : 0);
  };
  g.operators.forEach((o) => depth(o.name));
  const cols = {};
  g.operators.forEach((o) => (cols[layer[o.name]] = cols[layer[o.name]] || []).push(o));
  const pos = {};
  let maxRows = 0;
  Object.entries(cols).forEach(([l, ops]) => { maxRows = Math.max(maxRows, ops.length); ops.forEach((o, i) => (pos[o.name] = [l * (NODE_W + GAP_X) + 10, i * (NODE_H + GAP_Y) + 10])); });
  const width = (Object.keys(cols).length) * (NODE_W + GAP_X) + 20, height = maxRows * (NODE_H + GAP_Y) + 20;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height); svg.setAttribute("id", "dag-svg");
  svg.innerHTML = `<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#8c959f"/></marker></defs>`;
  state.dagNodes = {}; state.dagEdges = {};
  for (const e of g.edges) {
    const a = pos[e.src], b = pos[e.dst];
    if (!a || !b) continue;
    const x1 = a[0] + NODE_W, y1 = a[1] + NODE_H / 2, x2 = b[0], y2 = b[1] + NODE_H / 2, mx = (x1 + x2) / 2;
    const path = document.createElementNS(ns, "path");
    path.setAttribute("class", "edge"); path.setAttribute("marker-end", "url(#arrow)");
    path.setAttribute("d", x2 > x1 ? `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}` : `M${x1},${y1} C${x1 + 60},${y1 - 60} ${x2 - 60},${y2 - 60} ${x2},${y2}`);
    svg.appendChild(path);
    const t = document.createElementNS(ns, "text");
    t.setAttribute("class", "elabel"); t.setAttribute("text-anchor", "middle");
    t.setAttribute("x", mx); t.setAttribute("y", (y1 + y2) / 2 - 5);
    const title = document.createElementNS(ns, "title"); title.textContent = `${e.src} → ${e.dst}: local / remote requests per second`;
    svg.appendChild(t); t.appendChild(document.createTextNode("")); t.appendChild(title);
    state.dagEdges[e.src + ">" + e.dst] = t.firstChild;
  }
  for (const o of g.operators) {
    const [x, y] = pos[o.name];
    const gr = document.createElementNS(ns, "g");
    gr.setAttribute("class", "node" + (o.stateful ? " stateful" : "") + (o.source ? " source" : ""));
    gr.setAttribute("transform", `translate(${x},${y})`);
    gr.innerHTML = `<rect width="${NODE_W}" height="${NODE_H}"></rect><text class="name" x="8" y="16"></text><text class="stats" x="8" y="32"></text><text class="errs" x="8" y="47"></text><text class="wm" x="8" y="62"></text><title></title>`;
    gr.querySelector(".name").textContent = o.name + (o.stateful ? " (keyed)" : "");
    gr.querySelector("title").textContent = o.name + (o.source ? " · source" : "") + (o.stateful ? " · stateful" : "");
    svg.appendChild(gr);
    state.dagNodes[o.name] = { g: gr, stats: gr.querySelector(".stats"), errs: gr.querySelector(".errs"), wm: gr.querySelector(".wm") };
  }
  const box = $("dag"); box.innerHTML = ""; box.appendChild(svg);
}

// The placement matrix: rebuilt when the epoch or the shape changes.
function renderMatrix(m) {
  if (!m) return;
  const key = m.epoch + "#" + m.operators.join("|") + "#" + m.workers.join("|");
  if (key === state.matrixKey) return;
  state.matrixKey = key;
  const shade = (s) => `background: rgba(31,111,235,${(0.08 + 0.6 * s).toFixed(2)})`;
  $("matrix").innerHTML = `<table class="matrix" id="matrix-table"><thead><tr><th class="op">operator \\ worker (epoch ${m.epoch})</th>${m.workers.map((w) => `<th>${esc(w)}</th>`).join("")}</tr></thead><tbody>` +
    m.operators.map((o, i) => `<tr><th class="op">${esc(o)}</th>${m.cells[i].map(([s, kg, inst]) => s > 0 ?
      `<td style="${shade(s)}" title="share ${fmt(s * 100, 1)} %, ${kg} key groups, ${inst} instances">${fmt(s * 100, 0)} %<small>${kg ? kg + " kg" : ""}${inst ? " ×" + inst : ""}</small></td>` : "<td></td>").join("")}</tr>`).join("") +
    `</tbody></table>`;
}

// Timelines: a small canvas line chart per figure, redrawn each tick (≤ 600 points).
function renderCharts(series) {
  lineChart($("chart-rate"), series, [["input_rate", "#8c959f"], ["throughput", "#1f6feb"]]);
  lineChart($("chart-workers"), series, [["workers", "#2da44e"]], true);
  lineChart($("chart-latency"), series.map((p) => ({ t: p.t, p95: p.p95 === null || p.p95 === undefined ? null : p.p95 * 1e3 })), [["p95", "#cf222e"]]);
}
function lineChart(canvas, pts, lines, step = false) {
  const dpr = window.devicePixelRatio || 1, w = canvas.clientWidth || 300, h = canvas.clientHeight || 140;
  if (canvas.width !== w * dpr) { canvas.width = w * dpr; canvas.height = h * dpr; }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0); ctx.clearRect(0, 0, w, h);
  if (!pts.length) return;
  const t0 = pts[0].t, t1 = Math.max(pts[pts.length - 1].t, t0 + 1);
  let ymax = 0;
  for (const p of pts) for (const [k] of lines) if (p[k] > ymax) ymax = p[k];
  ymax = ymax > 0 ? ymax * 1.1 : 1;
  const L = 48, B = 18, X = (t) => L + (t - t0) / (t1 - t0) * (w - L - 6), Y = (v) => h - B - v / ymax * (h - B - 6);
  ctx.strokeStyle = "#d9dcde"; ctx.fillStyle = "#6b7378"; ctx.font = "10px system-ui"; ctx.lineWidth = 1;
  for (let i = 0; i <= 3; i++) { const v = ymax * i / 3, y = Y(v); ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(w - 6, y); ctx.stroke(); ctx.fillText(fmt(v, v < 10 ? 1 : 0), 2, y + 3); }
  ctx.fillText(fmt(t0) + " s", L, h - 4); ctx.fillText(fmt(t1) + " s", w - 40, h - 4);
  for (const [k, color] of lines) {
    ctx.strokeStyle = color; ctx.lineWidth = 1.5; ctx.beginPath();
    let started = false, prevY = null;
    for (const p of pts) {
      const v = p[k]; if (v === null || v === undefined) { started = false; continue; }
      const x = X(p.t), y = Y(v);
      if (!started) { ctx.moveTo(x, y); started = true; } else { if (step && prevY !== null) ctx.lineTo(x, prevY); ctx.lineTo(x, y); }
      prevY = y;
    }
    ctx.stroke();
  }
}

parseRoute(); showRoute(); connect();
