// Sluice dashboard: polls /api/overview every second and /debug/decisions
// every two, and draws everything itself (inline SVG, no libraries).
"use strict";

const POLL_MS = 1000;
const DECISIONS_LIMIT = 40;
const NS = "http://www.w3.org/2000/svg";

// Score terms in the order the bars stack them, with their colours.
const TERM_COLORS = {
  active_requests: "#5aa9e6",
  queue_length: "#f28e2b",
  job_cost: "#76b7b2",
  latency: "#e15759",
  kv_pressure: "#edc948",
  gpu_util: "#b07aa1",
  throughput: "#59a14f",
  prefix: "#ff9da7",
};
const EXTRA_COLORS = ["#9c755f", "#bab0ac", "#86bcb6", "#d4a6c8"];
const LINE_COLORS = ["#5aa9e6", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7"];

const state = {
  seq: 0,
  samples: [],
  window: 300,
  intervalMs: 1000,
  offset: 0,
  limit: 24,
  sort: "config",
  q: "",
  paused: false,
  selected: "",
  lastOK: 0,
  token: "",
  extraTerms: {},
  busiest: [],
  lastChosen: "",
  serverNow: 0,
  // awaitTTFT is the decision shown in the detail while its request has no
  // first token yet; the detail is fetched again when the list says it has
  // one, or once more when it leaves the list.
  awaitTTFT: "",
  openNotes: new Set(), // the cards' notes the reader opened, by worker and kind
};

// An admin token, when the router wants one, comes from #token=… or
// ?token=… once and is kept for the tab, not in the address bar. A
// fragment typed into an open tab does not reload it: hashchange.
function takeToken() {
  const h = new URLSearchParams(location.hash.slice(1));
  const q = new URLSearchParams(location.search);
  const t = h.get("token") || q.get("token");
  if (t) {
    sessionStorage.setItem("sluice-token", t);
    history.replaceState(null, "", location.pathname);
  }
  state.token = sessionStorage.getItem("sluice-token") || "";
}
takeToken();
window.addEventListener("hashchange", takeToken);

const $ = (id) => document.getElementById(id);

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

async function getJSON(url) {
  const headers = {};
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const r = await fetch(url, { headers, cache: "no-store" });
  let body = null;
  try { body = await r.json(); } catch (e) { /* not JSON */ }
  if (!r.ok) {
    const msg = body && body.error ? body.error.message : r.status + " " + r.statusText;
    const err = new Error(msg);
    err.status = r.status;
    throw err;
  }
  return body;
}

function banner(msg) {
  const b = $("banner");
  if (!msg) { b.hidden = true; return; }
  b.hidden = false;
  b.textContent = msg;
}

// ---------- number formatting ----------

function fmt(v, digits) {
  if (v == null || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (digits == null) digits = a >= 100 ? 0 : a >= 10 ? 1 : 2;
  return v.toFixed(digits);
}
function fmtMs(v) {
  if (v == null) return "–";
  if (v >= 10000) return (v / 1000).toFixed(1) + " s";
  if (v >= 1000) return (v / 1000).toFixed(2) + " s";
  return fmt(v) + " ms";
}
function fmtPct(v) { return v == null ? "–" : Math.round(v * 100) + "%"; }
function fmtAge(ms) {
  if (ms == null) return "";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(ms < 10000 ? 1 : 0) + " s";
  return Math.round(ms / 60000) + " min";
}
function fmtTime(t) {
  const d = new Date(t);
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}
function termColor(name) {
  if (TERM_COLORS[name]) return TERM_COLORS[name];
  if (!state.extraTerms[name]) {
    state.extraTerms[name] = EXTRA_COLORS[Object.keys(state.extraTerms).length % EXTRA_COLORS.length];
  }
  return state.extraTerms[name];
}

// ---------- charts ----------

function svg(tag, attrs) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  return e;
}

// lineChart draws series (each {name, color, values: [number|null], fill,
// dash}) over the times ts (Unix ms) into the svg el, and the latest value
// of each into the legend.
function lineChart(el, legend, ts, series, opts) {
  opts = opts || {};
  const W = Math.max(el.clientWidth, 200), H = el.clientHeight || 130;
  const L = 38, R = 6, T = 18, B = 16;
  el.setAttribute("viewBox", `0 0 ${W} ${H}`);
  el.replaceChildren();
  const now = ts.length ? ts[ts.length - 1] : Date.now();
  // A young router shows what it has (at least a minute), growing to the
  // whole ring.
  const full = state.window * state.intervalMs;
  const have = ts.length ? now - ts[0] : 0;
  const span = Math.min(full, Math.max(60000, Math.ceil(have / 60000) * 60000));
  const t0 = now - span;
  let vmax = 0;
  for (const s of series) for (const v of s.values) if (v != null && v > vmax) vmax = v;
  const ax = axis(vmax * 1.02, opts);
  const ymax = ax.max;
  const x = (t) => L + ((t - t0) / span) * (W - L - R);
  const y = (v) => T + (1 - v / ymax) * (H - T - B);
  for (let i = 0; i <= ax.ticks; i++) {
    const v = i * ax.step;
    el.append(svg("line", { x1: L, x2: W - R, y1: y(v * ax.div), y2: y(v * ax.div), class: "grid" }));
    const tx = svg("text", { x: L - 4, y: y(v * ax.div) + 3, "text-anchor": "end", class: "ytick" });
    tx.textContent = v.toFixed(ax.digits);
    el.append(tx);
  }
  // The y axis's unit, once, above its labels.
  const ut = svg("text", { x: 2, y: 10, class: "unit" });
  ut.textContent = ax.unit;
  el.append(ut);
  const step = [10000, 15000, 30000, 60000, 120000].find((st) => span / st <= 6) || 300000;
  for (let ago = 0; ago <= span; ago += step) {
    const tx = svg("text", { x: x(now - ago), y: H - 3, "text-anchor": ago === 0 ? "end" : ago === span ? "start" : "middle", class: "xtick" });
    tx.textContent = ago === 0 ? "now" : "−" + fmtAgo(ago);
    el.append(tx);
  }
  const parts = [];
  for (const s of series) {
    let d = "", open = false, first = null, last = null;
    s.values.forEach((v, i) => {
      if (v == null || ts[i] < t0) { open = false; return; }
      const px = x(ts[i]).toFixed(1), py = y(v).toFixed(1);
      d += (open ? "L" : "M") + px + " " + py;
      if (first == null) first = px;
      last = px;
      open = true;
    });
    if (!d) continue;
    if (s.fill) {
      el.append(svg("path", { d: d + `L${last} ${y(0)}L${first} ${y(0)}Z`, fill: s.color, "fill-opacity": 0.18, stroke: "none" }));
    }
    const p = svg("path", { d, fill: "none", stroke: s.color, "stroke-width": s.width || 1.6, "stroke-linejoin": "round" });
    if (s.dash) p.setAttribute("stroke-dasharray", s.dash);
    parts.push(p);
  }
  el.append(...parts);
  el.dataset.points = String(ts.length);
  if (legend) {
    legend.innerHTML = series.map((s) => {
      let lastV = null;
      for (let i = s.values.length - 1; i >= 0; i--) if (s.values[i] != null) { lastV = s.values[i]; break; }
      const shown = opts.unit === "ms" ? fmtMs(lastV) : fmt(lastV, opts.digits);
      const mark = s.dash ? `background:repeating-linear-gradient(90deg,${s.color} 0 4px,transparent 4px 7px)` : `background:${s.color}`;
      return `<span${s.key ? ` data-k="${esc(s.key)}"` : ""}><i style="${mark}"></i>${esc(s.name)} <b>${shown}</b></span>`;
    }).join("");
  }
}
function fmtAgo(ms) {
  const s = Math.round(ms / 1000);
  if (s < 60) return s + "s";
  return Math.floor(s / 60) + "m" + (s % 60 ? (s % 60) + "s" : "");
}
const SMOOTH = 5;
function smooth(v, n) {
  const out = new Array(v.length);
  let sum = 0;
  for (let i = 0; i < v.length; i++) {
    sum += v[i];
    if (i >= n) sum -= v[i - n];
    out[i] = sum / Math.min(i + 1, n);
  }
  return out;
}
// axis picks one unit for a chart's y axis and round steps in it: a
// chart in milliseconds is drawn in seconds once it reaches a second, so
// every label on an axis is in the unit named at its top. The steps are
// 1, 2 or 5 times a power of ten, at most four of them.
function axis(vmax, opts) {
  let unit = opts.unit || "", div = 1;
  if (unit === "ms" && vmax >= 1000) { unit = "s"; div = 1000; }
  const top = Math.max(vmax, opts.min || 0) / div;
  let step = 1;
  if (top > 0) {
    const p = Math.pow(10, Math.floor(Math.log10(top / 4)));
    step = [1, 2, 5, 10].map((m) => m * p).find((st) => top / st <= 4 + 1e-9);
  }
  const ticks = Math.max(1, Math.ceil(top / step - 1e-9));
  const digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  return { unit, div, step, ticks, digits, max: ticks * step * div };
}

function drawCharts(busiest) {
  if (busiest) state.busiest = busiest;
  busiest = state.busiest;
  const S = state.samples;
  const ts = S.map((s) => s.t);
  const perSec = 1000 / state.intervalMs;
  // Counts per one-second sample are spiky at a few requests a second:
  // rates are drawn as a trailing 5 s average.
  const rate = (key) => smooth(S.map((s) => s[key] * perSec), SMOOTH);
  lineChart($("ch-queue"), $("lg-queue"), ts, [
    { name: "waiting", color: "#f28e2b", values: S.map((s) => s.queued), fill: true },
  ], { digits: 0, unit: "requests" });
  lineChart($("ch-admit"), $("lg-admit"), ts, [
    { name: "admitted", color: "#5aa9e6", values: rate("admitted"), fill: true },
    { name: "of them held first", color: "#f28e2b", values: rate("held"), key: "held" },
    { name: "completed", color: "#59a14f", values: rate("ok") },
  ], { unit: "per s" });
  lineChart($("ch-refuse"), $("lg-refuse"), ts, [
    { name: "queue full (429)", color: "#f0b429", values: rate("r429"), fill: true },
    { name: "unavailable (503)", color: "#ef5a5a", values: rate("r503"), fill: true },
    { name: "failed", color: "#9d8cf0", values: rate("failed") },
  ], { min: 1, unit: "per s" });
  const pct = (key, p) => S.map((s) => (s[key] ? s[key][p] : null));
  // TTFT as clients see it (from arrival at Sluice), with the workers'
  // share of it (from sending to the worker) dashed beside it: the gap
  // between the two is time spent in Sluice, mostly queueing. p95 is left
  // out: over a window of tens of requests it is p99.
  lineChart($("ch-ttft"), $("lg-ttft"), ts, [
    { name: "p50", color: "#5aa9e6", values: pct("ttft_ms", "p50") },
    { name: "p99", color: "#ef5a5a", values: pct("ttft_ms", "p99") },
    { name: "worker p50", color: "#5aa9e6", values: pct("worker_ttft_ms", "p50"), dash: "4 3", key: "worker" },
    { name: "worker p99", color: "#ef5a5a", values: pct("worker_ttft_ms", "p99"), dash: "4 3", key: "worker" },
  ], { unit: "ms" });
  lineChart($("ch-tpot"), $("lg-tpot"), ts, [
    { name: "p50", color: "#5aa9e6", values: pct("tpot_ms", "p50") },
    { name: "p99", color: "#ef5a5a", values: pct("tpot_ms", "p99") },
  ], { unit: "ms" });
  // Per-worker series end at the newest sample; align them to its times.
  const conc = (busiest || []).map((w, i) => {
    const vals = new Array(ts.length).fill(null);
    const off = ts.length - w.active.length;
    w.active.forEach((v, j) => { if (off + j >= 0 && v >= 0) vals[off + j] = v; });
    return { name: w.name, color: LINE_COLORS[i % LINE_COLORS.length], values: vals };
  });
  lineChart($("ch-conc"), $("lg-conc"), ts, conc, { min: 1, digits: 0, unit: "requests" });
}

// ---------- worker cards ----------

function sparkline(values, limit) {
  const W = 240, H = 26;
  const n = values.length;
  if (!n) return "";
  const top = Math.max(limit || 1, ...values, 1);
  let d = "", open = false;
  values.forEach((v, i) => {
    if (v < 0) { open = false; return; }
    const px = ((i / Math.max(n - 1, 1)) * W).toFixed(1);
    const py = (H - 1 - (v / top) * (H - 3)).toFixed(1);
    d += (open ? "L" : "M") + px + " " + py;
    open = true;
  });
  const ly = (H - 1 - ((limit || 0) / top) * (H - 3)).toFixed(1);
  return `<svg class="spark" viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" aria-label="in flight, last ${n} samples">` +
    (limit ? `<line x1="0" x2="${W}" y1="${ly}" y2="${ly}" stroke="#8a98a8" stroke-dasharray="3 3" stroke-width="1" vector-effect="non-scaling-stroke"/>` : "") +
    `<path d="${d}" fill="none" stroke="#5aa9e6" stroke-width="1.5" vector-effect="non-scaling-stroke"/></svg>`;
}

// scoreBar draws a candidate's weighted terms stacked: costs right of the
// zero line, rewards (negative weights) left of it, on a scale shared by
// every bar drawn with the same extent so bars compare.
function scoreBar(terms, extent) {
  const neg = extent.neg, span = extent.neg + extent.pos || 1;
  const zero = (neg / span) * 100;
  let right = zero, left = zero, html = "";
  for (const t of orderTerms(terms)) {
    const w = (Math.abs(t.weighted) / span) * 100;
    if (w <= 0) continue;
    let at;
    if (t.weighted >= 0) { at = right; right += w; } else { left -= w; at = left; }
    const tip = `${termWords(t.name)} (${t.name}): raw ${fmt(t.raw)} → norm ${fmt(t.norm)} × weight ${fmt(t.weight)} = ${fmt(t.weighted, 3)}` +
      (t.source ? ` (${t.source})` : "") + (t.stale ? " STALE" : "") + (t.neutral ? " neutral: no history yet" : "");
    html += `<span style="left:${at.toFixed(2)}%;width:${w.toFixed(2)}%;background:${termColor(t.name)}" title="${esc(tip)}"></span>`;
  }
  return `<div class="sbar" data-terms="${terms.length}">${html}<span class="zero" style="left:${zero.toFixed(2)}%"></span></div>`;
}
// termList names the largest contributions, so the bar's story reads
// without hovering.
function termList(terms) {
  const top = [...terms].filter((t) => Math.abs(t.weighted) >= 0.005)
    .sort((a, b) => Math.abs(b.weighted) - Math.abs(a.weighted)).slice(0, 4);
  return `<div class="tlist">` + top.map((t) => `<span title="${esc(t.name)}"><i style="background:${termColor(t.name)}"></i>${esc(termWords(t.name))} <b>${t.weighted > 0 ? "+" : ""}${fmt(t.weighted)}</b></span>`).join("") + `</div>`;
}
// adaptersLine is a worker card's line of the LoRA adapters it holds,
// those being loaded marked so; nothing when it holds none.
function adaptersLine(adapters) {
  if (!adapters || !adapters.length) return "";
  const names = adapters.map(a => a.state === "loading" ? a.name + " (loading)" : a.name);
  return `<div class="adapters" title="LoRA adapters: ${esc(adapters.map(a => a.name + " — " + a.state + (a.source ? ", " + a.source : "")).join("; "))}">LoRA ${esc(names.join(", "))}</div>`;
}

// Each score term in words, for the cards and the legend; its name as
// the decision records spell it is in the tooltips and the breakdown.
const TERM_WORDS = { active_requests: "in flight", queue_length: "engine queue", job_cost: "work in hand", kv_pressure: "KV cache", gpu_util: "GPU busy", throughput: "decode speed", latency: "first-token time", prefix: "cached prompt" };
const termWords = (name) => TERM_WORDS[name] || name.replace(/_/g, " ");

function orderTerms(terms) {
  const order = Object.keys(TERM_COLORS);
  return [...terms].sort((a, b) => {
    const ia = order.indexOf(a.name), ib = order.indexOf(b.name);
    return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib);
  });
}
function extentOf(termLists) {
  let pos = 0, neg = 0;
  for (const terms of termLists) {
    let p = 0, n = 0;
    for (const t of terms || []) if (t.weighted >= 0) p += t.weighted; else n -= t.weighted;
    pos = Math.max(pos, p); neg = Math.max(neg, n);
  }
  return { pos, neg };
}

function reading(r, f) {
  if (!r) return { text: "–", cls: "", tip: "not reported" };
  const stale = r.age_ms > 5000;
  return { text: f(r.value), cls: stale ? "stale" : "", tip: `${r.source || ""}, read ${fmtAge(r.age_ms)} ago` };
}

// Where a worker's limit came from, in words.
const LIMIT_SOURCE = { learned: "learned from its measured speed", config: "set in the config", slots: "the slots it reports", default: "the default cap" };

// note is a line of a card with its whole explanation one click away:
// a <details> whose summary is the line, open across refreshes once
// opened (state.openNotes, by worker and kind).
function note(w, kind, summary, body, cls) {
  const key = kind + ":" + w.name;
  return `<details class="note ${cls || ""}" data-k="${esc(kind)}" data-key="${esc(key)}"${state.openNotes.has(key) ? " open" : ""}>` +
    `<summary>${summary}</summary><div class="more">${body}</div></details>`;
}

function ordinal(n) {
  const s = n % 100 >= 11 && n % 100 <= 13 ? "th" : ({ 1: "st", 2: "nd", 3: "rd" })[n % 10] || "th";
  return n + s;
}

function cardHTML(w, extent) {
  const health = w.draining ? "draining" : w.health;
  const lim = w.limit || 0;
  // In flight across replicas: the learned limit bounds the total.
  const other = w.active_other_replicas || 0, total = w.active + other;
  const load = lim ? total / lim : 0;
  const meterCls = load >= 1 ? "full" : load >= 0.8 ? "hot" : "";
  const kv = reading(w.kv, fmtPct), gpu = reading(w.gpu, fmtPct), wq = reading(w.worker_queue, (v) => fmt(v, 0));
  const a = w.averages || {};
  const sc = w.score;
  let notes = "";
  if (w.limit_source || w.limit_reason) {
    const cap = w.limit_cap && w.limit_cap !== lim ? ` (at most ${w.limit_cap})` : "";
    const source = LIMIT_SOURCE[w.limit_source] || w.limit_source || "";
    let body = w.limit_reason ? `<p>${esc(w.limit_reason)}</p>` : "";
    if (w.limit_cap) body += `<p>Its cap: <b>${esc(w.limit_cap)}</b> at a time.</p>`;
    const mv = w.limit_moved;
    if (mv && mv.at) {
      const age = state.serverNow - Date.parse(mv.at);
      const why = mv.why && mv.why !== w.limit_reason ? ": " + esc(mv.why) : "";
      body += `<p>moved <b>${esc(mv.from)}→${esc(mv.to)}</b> ${fmtAge(Math.max(age, 0))} ago${why}</p>`;
    }
    notes += note(w, "limit", `limit <b>${esc(lim)}</b>${source ? " · " + esc(source) : ""}${esc(cap)}`, body || "<p>no more to say</p>", "limitnote");
  } else if (w.slots) {
    notes += `<div class="limitnote">worker reports <b>${esc(w.slots)}</b> slots</div>`;
  }
  // How far the predictor has been off here: the median relative error
  // of its last predictions; when it keeps missing, admission by promise
  // judges the worker by its limit instead, and says why.
  const pr = w.prediction;
  if (pr && (pr.ttft_n || pr.decode_n)) {
    const parts = [];
    if (pr.ttft_n) parts.push(`first token <b>${fmtPct(pr.ttft_error)}</b>`);
    if (pr.decode_n) parts.push(`decode <b>${fmtPct(pr.decode_error)}</b>`);
    const n = Math.max(pr.ttft_n, pr.decode_n);
    const body = `<p>How far Sluice's latency forecasts for this card have been from what happened: the median of |forecast − actual| / actual over its last ${esc(n)} requests.</p>` +
      (pr.trusted ? `<p>Close enough to rely on when admitting by promise.</p>`
        : `<p>Too far off to rely on: ${esc(pr.untrusted || "")}. Admission by promise judges this card by its limit until they come closer.</p>`);
    notes += note(w, "forecast", `forecasts off: ${parts.join(", ")}${pr.trusted ? "" : " · not relied on"}`, body, "prednote");
  }
  let scoreHTML = `<div class="score"><div class="line"><span>not in a decision yet</span></div></div>`;
  if (sc) {
    const rank = sc.eligible ? (sc.rank ? `ranked ${ordinal(sc.rank)}` : "could take it") : "could not take it";
    scoreHTML = `<div class="score"><div class="line" title="its score in the newest decision that weighed it: the lowest score wins"><span>last decision: <b>${esc(rank)}</b></span><span>score <b>${fmt(sc.total, 1)}</b>${sc.age_ms != null ? " · " + fmtAge(sc.age_ms) + " ago" : ""}</span></div>` +
      (sc.terms.length ? scoreBar(sc.terms, extent) + termList(sc.terms) : "") +
      (sc.why ? `<div class="why">${esc(sc.why)}</div>` : "") + `</div>`;
  }
  const picked = w.name === state.lastChosen;
  const stat = (label, tip, value, cls, key) => `<div title="${esc(tip)}"><dt>${label}</dt><dd class="${cls || ""}"${key ? ` data-k="${key}"` : ""}>${value}</dd></div>`;
  return `<header><span class="name" title="${esc(w.url || w.name)}">${esc(w.name)}</span><span class="badge ${esc(health)}">${esc(health)}</span>` +
    (picked ? `<span class="badge rank" title="the newest request was sent here">last pick</span>` : "") + `</header>` +
    `<div class="models">${esc((w.models || []).join(", ") || "no models known")}</div>` +
    adaptersLine(w.adapters) +
    (w.health_reason && w.health !== "ok" ? `<div class="reason">${esc(w.health_reason)}</div>` : "") +
    `<div class="load" title="requests running on it against its limit"><span class="num" data-k="active"${other ? ` title="${esc(w.active)} from this replica, ${esc(other)} from the others"` : ""}>${esc(total)}<small>/${esc(lim)}</small></span><div class="meter ${meterCls}"><div style="width:${Math.min(load, 1) * 100}%"></div></div><span class="unit">running</span></div>` +
    notes +
    `<dl class="kv">` +
    stat("waiting in Sluice", "requests for its models held in Sluice's queue until a card has room", esc(w.sluice_queue ?? 0)) +
    stat("waiting in engine", "requests waiting inside the inference server itself: " + wq.tip, wq.text, wq.cls) +
    stat("KV cache used", "share of its KV cache in use: " + kv.tip, kv.text, kv.cls) +
    stat("GPU busy", "GPU utilisation: " + gpu.tip, gpu.text, gpu.cls) +
    stat("first token", "moving average of its time to first token, from sending to it (Sluice's queue not included)", fmtMs(a.ttft_ms), "", "worker-ttft") +
    stat("decode", "moving average of each stream's decode speed: tokens per second after the first", a.decode_tps != null ? fmt(a.decode_tps, 0) + " tok/s" : "–") +
    stat("total time", "moving average of a request's whole time on it, from sending to its last token", fmtMs(a.e2e_ms)) +
    stat("measured", "requests the averages are over", a.n != null ? esc(a.n) + " req" : "–") +
    `</dl>` + sparkline(w.spark || [], lim) + scoreHTML;
}

const cardEls = new Map();
function drawCards(ov) {
  const box = $("cards");
  const extent = extentOf(ov.workers.map((w) => (w.score ? w.score.terms : [])));
  const keep = new Set();
  ov.workers.forEach((w, i) => {
    keep.add(w.name);
    let el = cardEls.get(w.name);
    if (!el) {
      el = document.createElement("article");
      cardEls.set(w.name, el);
    }
    const health = w.draining ? "draining" : "h-" + w.health;
    el.className = "card " + health + (w.name === state.lastChosen ? " winner" : "");
    el.dataset.worker = w.name;
    el.dataset.active = String(w.active + (w.active_other_replicas || 0));
    el.dataset.health = w.health;
    el.innerHTML = cardHTML(w, extent);
    if (box.children[i] !== el) box.insertBefore(el, box.children[i] || null);
  });
  for (const [name, el] of cardEls) {
    if (!keep.has(name)) { el.remove(); cardEls.delete(name); }
  }
  const p = ov.page;
  const from = p.total ? p.offset + 1 : 0, to = Math.min(p.offset + p.limit, p.total);
  $("page-info").textContent = `${from}–${to} of ${p.total}`;
  $("prev").disabled = p.offset <= 0;
  $("next").disabled = p.offset + p.limit >= p.total;
  const seen = new Set();
  for (const w of ov.workers) for (const t of (w.score ? w.score.terms : [])) seen.add(t.name);
  const names = orderTerms([...seen].map((name) => ({ name })));
  $("terms-legend").innerHTML = names.length
    ? `<span>what a card's score counts (the lowest score wins):</span>` + names.map((t) => `<span title="${esc(t.name)}"><i style="background:${termColor(t.name)}"></i>${esc(termWords(t.name))}</span>`).join("")
    : "";
}

function drawSummary(ov) {
  const f = ov.fleet;
  $("sum-workers").textContent = f.workers;
  $("sum-active").textContent = f.active;
  $("sum-limit").textContent = f.limit;
  $("sum-queued").textContent = f.queued;
  $("sum-admitted").textContent = ov.totals.admitted;
  $("sum-held").textContent = ov.totals.held ?? 0;
  $("sum-429").textContent = ov.totals.r429;
  $("sum-503").textContent = ov.totals.r503;
  const h = f.health || {};
  const parts = [];
  if (h.ok) parts.push(`<b style="color:var(--ok)">${h.ok}</b> ok`);
  if (h.loading) parts.push(`<b style="color:var(--warn)">${h.loading}</b> loading`);
  if (h.unknown) parts.push(`<b style="color:var(--warn)">${h.unknown}</b> unknown`);
  if (h.down) parts.push(`<b style="color:var(--bad)">${h.down}</b> down`);
  if (f.draining) parts.push(`<b style="color:var(--info)">${f.draining}</b> draining`);
  $("chip-health").innerHTML = parts.join(" · ") || "–";
  $("ttft-note").textContent = `dashed: the workers' share · last ${ov.latency_window_s} s`;
  $("tpot-note").textContent = `last ${ov.latency_window_s} s`;
}

// ---------- polling ----------

async function pollOverview() {
  if (!state.paused) {
    try {
      const qs = new URLSearchParams({ since: state.seq, offset: state.offset, limit: state.limit, sort: state.sort, decisions: DECISIONS_LIMIT });
      if (state.q) qs.set("q", state.q);
      const ov = await getJSON("/api/overview?" + qs);
      if (state.paused) { updateLive(); return setTimeout(pollOverview, POLL_MS); }
      if (ov.seq < state.seq) state.samples = []; // the router restarted
      state.intervalMs = ov.interval_ms || 1000;
      state.window = ov.window || 300;
      state.samples.push(...ov.samples);
      if (state.samples.length > state.window) state.samples.splice(0, state.samples.length - state.window);
      state.seq = ov.seq;
      state.serverNow = ov.now;
      if (ov.page.offset >= ov.page.total && ov.page.total > 0 && state.offset > 0) {
        state.offset = Math.max(0, Math.floor((ov.page.total - 1) / state.limit) * state.limit);
      }
      drawSummary(ov);
      drawCharts(ov.busiest);
      drawDecisions(ov.decisions || []);
      drawCards(ov);
      state.lastOK = Date.now();
      banner("");
    } catch (e) {
      if (e.status === 401 || e.status === 403) {
        banner("This router wants its admin token: open this page as /#token=YOUR_TOKEN. (" + e.message + ")");
      } else {
        banner("Cannot reach the router: " + e.message);
      }
    }
  }
  updateLive();
  setTimeout(pollOverview, POLL_MS);
}

function updateLive() {
  const dot = $("live-dot"), txt = $("live-text");
  if (state.paused) { dot.className = "dot"; txt.textContent = "paused"; return; }
  const age = Date.now() - state.lastOK;
  if (state.lastOK && age < 3 * POLL_MS) { dot.className = "dot on"; txt.textContent = "live"; }
  else { dot.className = "dot off"; txt.textContent = state.lastOK ? "stale " + fmtAge(age) : "connecting…"; }
}

function drawDecisions(list) {
  const newest = list.find((r) => r.chosen);
  state.lastChosen = newest ? newest.chosen : "";
  drawDecisionList(list);
  // A fresh page explains the newest request held in the queue, else the
  // newest placement, until one is picked.
  const shown = list.find((r) => r.chosen && r.queue_wait_ms > 0) || newest;
  if (!state.selected && shown) showDecision(shown.id);
}

// Refusals in words; a decision record names them by code.
const OUTCOME_WORDS = {
  queue_full: "queue full", queue_timeout: "waited too long", deadline_unmeetable: "could not be served in time",
  slo_unmeetable: "its promise could not be kept", no_healthy_worker: "no healthy worker", shutting_down: "shutting down",
  client_gone: "the client left", model_not_found: "no worker serves the model", adapter_load_failed: "its adapter failed to load",
};
const outcomeWords = (o) => OUTCOME_WORDS[o] || String(o || "").replace(/_/g, " ");
const held = (r) => r.outcome === "bound" && r.queue_wait_ms > 0;


// Rows are kept per decision id (records never change), so a row under
// the pointer is not replaced while someone clicks it.
const rowEls = new Map();
function drawDecisionList(list) {
  const body = $("dlist");
  if (!list.length) {
    rowEls.clear();
    body.innerHTML = `<tr><td colspan="4" class="muted">no decisions yet: send a request</td></tr>`;
    return;
  }
  const keep = new Set();
  list.forEach((r, i) => {
    keep.add(r.id);
    let tr = rowEls.get(r.id);
    if (!tr) {
      const bound = r.outcome === "bound";
      tr = document.createElement("tr");
      tr.dataset.id = r.id;
      tr.dataset.outcome = r.outcome;
      tr.title = "decision " + r.id;
      if (held(r)) tr.classList.add("held");
      const where = !bound ? `refused: ${esc(outcomeWords(r.outcome))}` : held(r) ? `held, then ${esc(r.chosen)}` : esc(r.chosen);
      tr.innerHTML = `<td>${esc(fmtTime(r.time))}</td>` +
        `<td class="${!bound ? "out-refused" : held(r) ? "out-held" : "out-bound"}" data-k="where">${where}${r.attempt > 1 ? " (retry " + esc(r.attempt) + ")" : ""}</td>` +
        `<td class="num" data-k="wait">${r.queue_wait_ms > 0 ? fmtMs(r.queue_wait_ms) : "none"}</td><td class="num" data-k="ttft"></td>`;
      rowEls.set(r.id, tr);
    }
    // A decision that continued a stream another worker broke gains its
    // continuation when that stream ends: a badge on its outcome.
    const c = r.continuation;
    if (c && !tr.querySelector(".cont")) {
      const b = document.createElement("span");
      b.className = "cont";
      b.textContent = " ↪ from " + c.from;
      b.title = `continued a stream ${c.from} broke (${c.reason}): ${c.carried_tokens} tokens carried over, ` +
        `${c.gap_ms ? fmtMs(c.gap_ms) + " added" : "no token after it"}, ${c.outcome}`;
      tr.children[1].appendChild(b);
    }
    // A placement's first token comes after its decision: fill it in when
    // the list has it.
    const cell = tr.querySelector('td[data-k="ttft"]');
    const ttft = fmtMs(r.ttft_ms);
    if (cell.textContent !== ttft) {
      cell.textContent = ttft;
      cell.title = r.ttft_ms != null ? `time to first token from arrival at Sluice; the worker's share ${fmtMs(r.worker_ttft_ms)}` : "";
    }
    if (r.id === state.awaitTTFT && r.ttft_ms != null) {
      state.awaitTTFT = "";
      showDecision(r.id);
    }
    tr.classList.toggle("sel", r.id === state.selected);
    if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
  });
  for (const [id, tr] of rowEls) {
    if (!keep.has(id)) { tr.remove(); rowEls.delete(id); }
  }
  if (state.awaitTTFT && !keep.has(state.awaitTTFT)) {
    const id = state.awaitTTFT;
    state.awaitTTFT = "";
    showDecision(id, true);
  }
  for (const el of [...body.children]) if (!el.dataset.id) el.remove();
}

// showDecision fetches and shows a decision's breakdown; last says not to
// wait for its first token any longer.
async function showDecision(id, last) {
  id = id.trim();
  if (!id) return;
  state.selected = id;
  for (const tr of $("dlist").querySelectorAll("tr")) tr.classList.toggle("sel", tr.dataset.id === id);
  const box = $("detail");
  try {
    const r = await getJSON("/debug/decisions/" + encodeURIComponent(id));
    if (state.selected !== id) return; // another was picked meanwhile
    box.innerHTML = detailHTML(r);
    state.awaitTTFT = !last && r.outcome === "bound" && r.ttft_ms == null ? id : "";
  } catch (e) {
    box.innerHTML = `<p class="reason">${esc(e.message)}</p>`;
  }
}

function detailHTML(r) {
  const cands = [...(r.candidates || [])].sort((a, b) => {
    if (a.eligible !== b.eligible) return a.eligible ? -1 : 1;
    return (a.rank || 1e9) - (b.rank || 1e9);
  });
  const extent = extentOf(cands.map((c) => c.terms));
  // [label, value, key for tests, tooltip]
  const facts = [
    ["time", fmtTime(r.time)], ["model", r.model], ["outcome", r.outcome], ["worker", r.chosen || "–"],
    ["policy", r.policy], ["attempt", r.attempt], ["queue wait", fmtMs(r.queue_wait_ms), "queue", "time in Sluice's queue"],
  ];
  // What happened, in a sentence, before the numbers.
  let story;
  if (held(r)) {
    story = `<div class="story held">Held <b>${fmtMs(r.queue_wait_ms)}</b> in Sluice's queue rather than overload a card` +
      (r.queue_depth ? ` (${esc(r.queue_depth)} already waiting when it came)` : "") +
      `, then sent to <b>${esc(r.chosen)}</b> when it had room.</div>`;
  } else if (r.outcome === "bound") {
    story = `<div class="story">Sent to <b>${esc(r.chosen)}</b> at once.</div>`;
  } else {
    story = `<div class="story refused">Refused: <b>${esc(outcomeWords(r.outcome))}</b>` +
      (r.queue_wait_ms > 0 ? ` after ${fmtMs(r.queue_wait_ms)} in Sluice's queue` : "") + `.</div>`;
  }
  if (r.outcome === "bound") {
    const none = "no first token yet: in flight, not streamed, or failed before one";
    facts.push(
      ["TTFT (client)", fmtMs(r.ttft_ms), "ttft", r.ttft_ms != null ? "time to first token as the client saw it: from arrival at Sluice to the first token relayed, queueing included" : none],
      ["worker TTFT", fmtMs(r.worker_ttft_ms), "worker-ttft", r.worker_ttft_ms != null ? "the worker's share: from sending to it to its first token" : none]);
  }
  facts.push(["waiting when it came", r.queue_depth, "depth", "requests for its model already in Sluice's queue when it arrived"], ["prompt", (r.prompt_tokens ?? "–") + " tok"]);
  if (r.max_tokens) facts.push(["max tokens", r.max_tokens]);
  let html = `<h3 data-decision="${esc(r.id)}">${esc(r.id)}</h3>` + story + `<div class="facts">` +
    facts.map(([k, v, key, tip]) => `<span${key ? ` data-k="${esc(key)}"` : ""}${tip ? ` title="${esc(tip)}"` : ""}>${esc(k)} <b>${esc(v)}</b></span>`).join("") + `</div>` +
    `<div class="because"><span class="muted">${r.chosen ? "why " + esc(r.chosen) : "why"}:</span> ${esc(r.reason)}</div>`;
  for (const c of cands) {
    const cls = c.worker === r.chosen ? "chosen" : c.eligible ? "" : "inel";
    html += `<div class="cand ${cls}" data-worker="${esc(c.worker)}"><div class="head"><span class="name">${esc(c.worker)}</span>` +
      `<span>${c.eligible ? (c.rank ? "ranked " + ordinal(c.rank) : "could take it") : "could not take it: " + esc(c.why || "")}</span>` +
      (c.eligible ? `<span class="muted">running ${esc(c.active)}/${esc(c.limit)}</span>` : "") +
      (c.eligible ? `<span>score <b>${fmt(c.total, 3)}</b></span>` : "") + `</div>`;
    if (c.terms && c.terms.length) {
      html += scoreBar(c.terms, extent) +
        `<table><thead><tr><th>term</th><th class="num">raw</th><th class="num">norm</th><th class="num">weight</th><th class="num">weighted</th><th>source</th><th class="num">age</th></tr></thead><tbody>` +
        orderTerms(c.terms).map((t) => `<tr class="term"><td><i style="display:inline-block;width:8px;height:8px;border-radius:2px;margin-right:5px;background:${termColor(t.name)}"></i><span title="${esc(t.name)}">${esc(termWords(t.name))}</span>` +
          (t.stale ? `<span class="flag">stale</span>` : "") + (t.neutral ? `<span class="flag">neutral</span>` : "") + `</td>` +
          `<td class="num">${fmt(t.raw)}</td><td class="num">${fmt(t.norm, 3)}</td><td class="num">${fmt(t.weight)}</td><td class="num">${fmt(t.weighted, 3)}</td>` +
          `<td class="src" title="${esc(t.source || "")}">${esc(t.source || "sluice")}</td><td class="num">${t.age_ms != null ? fmtAge(t.age_ms) : "now"}</td></tr>`).join("") +
        `</tbody></table>`;
    }
    html += `</div>`;
  }
  return html;
}

// ---------- controls ----------

// A card's notes stay open, or closed, across the redraws every second:
// the page remembers which the reader opened. "toggle" does not bubble.
$("cards").addEventListener("toggle", (e) => {
  const d = e.target;
  if (!(d instanceof HTMLDetailsElement) || !d.dataset.key) return;
  if (d.open) state.openNotes.add(d.dataset.key); else state.openNotes.delete(d.dataset.key);
}, true);
$("dlist").addEventListener("click", (e) => {
  const tr = e.target.closest("tr[data-id]");
  if (tr) showDecision(tr.dataset.id);
});
$("search").addEventListener("submit", (e) => {
  e.preventDefault();
  showDecision($("search-id").value);
});
let filterTimer = 0;
$("filter").addEventListener("input", () => {
  clearTimeout(filterTimer);
  filterTimer = setTimeout(() => { state.q = $("filter").value.trim(); state.offset = 0; }, 250);
});
$("sort").addEventListener("change", () => { state.sort = $("sort").value; state.offset = 0; });
$("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); });
$("next").addEventListener("click", () => { state.offset += state.limit; });
$("pause").addEventListener("click", () => {
  state.paused = !state.paused;
  $("pause").textContent = state.paused ? "resume" : "pause";
  updateLive();
});
window.addEventListener("resize", () => drawCharts(null));

pollOverview();
