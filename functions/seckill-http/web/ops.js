// The operators' live view: /app/ops.html[?voucher=ID,ID]#token=ADMIN_JWT. Polls
// GET /status (admin scope) once a second and shows each sale's figures, the same as
// `seckill status`; admissions per second are the change in `admitted` between two
// polls over the server's time between them. Below the table, each sale's last
// minutes as charts the page draws itself (SVG made here, no script from elsewhere):
// admissions per second, stock left, drain lag; and the order events owed to the bus.
import { callRetrying, human, sentence, setToken, show, sleep, takeToken } from "./client.js";

const token = takeToken();
const named = new URLSearchParams(location.search).get("voucher");
const path = named ? `/status?voucher=${encodeURIComponent(named)}` : "/status";
const previous = new Map(); // voucher id -> {admitted, at}
// voucher id -> [{at, rate, stock, lag}], the last HISTORY_MS of polls.
const history = new Map();
const HISTORY_MS = 10 * 60 * 1000;
const SVG = "http://www.w3.org/2000/svg";
// The charts of a sale: [field, title, unit].
const CHARTS = [
  ["rate", "admissions/s", ""],
  ["stock", "stock left", ""],
  ["lag", "drain lag", "s"],
];

const or = (v, dash = "–") => (v === null || v === undefined ? dash : v);

// The cells of one row: field name -> text.
function cells(s, rate) {
  return {
    voucher: s.title ? `${s.voucher} ${s.title}` : s.voucher,
    phase: s.phase.replace("_", " "),
    stock_left: `${or(s.stock_left_redis)} / ${or(s.stock)}`,
    admitted: s.admitted,
    rate: rate === null ? "–" : rate.toFixed(0),
    confirmed: s.confirmed,
    waiting: s.pending + s.lag,
    lag: s.oldest_unfinished_ms === null ? "none" : human(s.oldest_unfinished_ms),
    dead_letters: s.dead_letters,
    awaiting_payment: s.awaiting_payment,
    paid: s.paid,
    expired: s.expired,
    refunds_due: s.refunds_due,
  };
}

function svg(name, attrs) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

// One chart: the points' values over their times, scaled to the box, with the latest
// value and the highest in its title.
function chart(points, field, title, unit) {
  const w = 240, h = 60;
  const box = svg("svg", { viewBox: `0 0 ${w} ${h}`, width: w, height: h, role: "img" });
  box.dataset.chart = field;
  const values = points.map((p) => p[field]).filter((v) => v !== null);
  const top = Math.max(1, ...values);
  const first = points.length ? points[0].at : 0;
  const span = Math.max(1, (points.at(-1)?.at ?? 0) - first);
  const xy = points
    .filter((p) => p[field] !== null)
    .map((p) => `${(((p.at - first) / span) * (w - 2) + 1).toFixed(1)},${(h - 1 - (p[field] / top) * (h - 12)).toFixed(1)}`);
  box.append(svg("rect", { x: 0, y: 0, width: w, height: h, fill: "none", stroke: "#ccc" }));
  box.append(svg("polyline", { points: xy.join(" "), fill: "none", stroke: "#1565c0", "stroke-width": 1.5 }));
  const last = values.length ? values.at(-1) : null;
  const label = svg("text", { x: 4, y: 10, "font-size": 9, fill: "#333" });
  label.textContent = `${title}: ${last === null ? "–" : last.toFixed(unit === "s" ? 1 : 0)}${unit} (max ${top.toFixed(unit === "s" ? 1 : 0)}${unit})`;
  box.append(label);
  const t = svg("title", {});
  t.textContent = label.textContent;
  box.append(t);
  return box;
}

// Redraws the charts of every sale listed.
function drawCharts(ids) {
  const area = document.getElementById("charts");
  for (const fig of area.querySelectorAll("figure[data-voucher]")) {
    if (!ids.includes(fig.dataset.voucher)) fig.remove();
  }
  for (const id of ids) {
    let fig = area.querySelector(`figure[data-voucher="${CSS.escape(id)}"]`);
    if (!fig) {
      fig = document.createElement("figure");
      fig.dataset.voucher = id;
      const caption = document.createElement("figcaption");
      caption.textContent = `voucher ${id}`;
      fig.append(caption);
      area.append(fig);
    }
    for (const old of fig.querySelectorAll("svg")) old.remove();
    const points = history.get(id) ?? [];
    for (const [field, title, unit] of CHARTS) fig.append(chart(points, field, title, unit));
  }
}

function row(id) {
  let tr = document.querySelector(`tr[data-voucher="${CSS.escape(id)}"]`);
  if (!tr) {
    tr = document.createElement("tr");
    tr.dataset.voucher = id;
    for (const field of Object.keys(cells({ phase: "" }, null))) {
      const td = document.createElement("td");
      td.dataset.field = field;
      tr.append(td);
    }
    document.getElementById("sales").append(tr);
  }
  return tr;
}

async function poll() {
  const a = await callRetrying("GET", path, { token });
  if (a.status !== 200) {
    show("message", sentence(a.body));
    return a.status === 401 || a.status === 403 ? "stop" : "again";
  }
  show("message", "");
  const at = Date.parse(a.body.server_time);
  // A sale no longer listed (it left the newest sales shown) loses its row rather
  // than keep figures that stopped changing.
  const listed = new Set(a.body.vouchers.map((s) => s.voucher));
  for (const tr of document.querySelectorAll("#sales tr[data-voucher]")) {
    if (!listed.has(tr.dataset.voucher)) {
      tr.remove();
      previous.delete(tr.dataset.voucher);
    }
  }
  for (const s of a.body.vouchers) {
    const before = previous.get(s.voucher);
    const rate = before && at > before.at
      ? ((s.admitted - before.admitted) * 1000) / (at - before.at)
      : null;
    previous.set(s.voucher, { admitted: s.admitted, at });
    const kept = (history.get(s.voucher) ?? []).filter((p) => p.at > at - HISTORY_MS);
    kept.push({
      at,
      rate,
      stock: s.stock_left_redis ?? null,
      lag: s.oldest_unfinished_ms === null ? 0 : s.oldest_unfinished_ms / 1000,
    });
    history.set(s.voucher, kept);
    const tr = row(s.voucher);
    for (const [field, text] of Object.entries(cells(s, rate))) {
      const td = tr.querySelector(`td[data-field="${field}"]`);
      if (td.textContent !== String(text)) td.textContent = String(text);
    }
  }
  for (const id of history.keys()) if (!listed.has(id)) history.delete(id);
  drawCharts(a.body.vouchers.map((s) => s.voucher));
  const ev = a.body.events;
  show("events", !ev ? "" : ev.owed === 0
    ? "Order events: none owed (every transition published)."
    : `Order events: ${ev.owed} owed, the oldest for ${human(ev.oldest_owed_ms ?? 0)}.`);
  show("updated", `Updated ${new Date(at).toLocaleTimeString()} (server time); ${a.body.vouchers.length} sale(s).`);
  return "again";
}

async function start() {
  const form = document.getElementById("token-form");
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    setToken(document.getElementById("token-input").value);
    location.reload();
  });
  if (!token) {
    form.hidden = false;
    show("updated", "");
    return;
  }
  while ((await poll()) !== "stop") await sleep(1000);
}

start();
