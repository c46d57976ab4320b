// The operators' live view: /app/ops.html[?voucher=ID,ID]#token=ADMIN_JWT. Polls
// GET /status (admin scope) once a second and shows each sale's figures, the same as
// `seckill status`; admissions per second are the change in `admitted` between two
// polls over the server's time between them.
import { callRetrying, human, sentence, setToken, show, sleep, takeToken } from "./client.js";

const token = takeToken();
const named = new URLSearchParams(location.search).get("voucher");
const path = named ? `/status?voucher=${encodeURIComponent(named)}` : "/status";
const previous = new Map(); // voucher id -> {admitted, at}

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
    const tr = row(s.voucher);
    for (const [field, text] of Object.entries(cells(s, rate))) {
      const td = tr.querySelector(`td[data-field="${field}"]`);
      if (td.textContent !== String(text)) td.textContent = String(text);
    }
  }
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
