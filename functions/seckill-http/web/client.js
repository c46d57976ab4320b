// The reference client of the seckill HTTP API (docs/http-api.md), shared by the buyer
// page (sale.js) and the operators' live view (ops.js). What any client must do on
// purpose is marked "Client rule".

// The API lives at the origin that served this page, under the same stage prefix:
// /app/sale.html -> "", /prod/app/sale.html -> "/prod".
export const API = location.pathname.replace(/\/app\/[^/]*$/, "");

// ---- the caller's token -----------------------------------------------------------
// Client rule: identity is the bearer token only, never a user id in a body. The page
// takes it once from the URL's fragment (#token=...), which browsers never send to a
// server or put in a Referer, keeps it for this tab only, and clears the fragment.
export function takeToken() {
  const hash = new URLSearchParams(location.hash.slice(1));
  const fromUrl = hash.get("token");
  if (fromUrl) {
    sessionStorage.setItem("seckill.token", fromUrl);
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("seckill.token");
}

export function setToken(token) {
  sessionStorage.setItem("seckill.token", token.trim());
}

// ---- the server's clock -----------------------------------------------------------
// Client rule: a sale opens by the server's clock, not the buyer's. Every voucher read
// carries `server_time`; the offset is taken from the read with the shortest round trip.
let offsetMs = 0;
let bestRttMs = Infinity;

export function learnClock(serverTime, sentAt, receivedAt) {
  const rtt = receivedAt - sentAt;
  const server = Date.parse(serverTime);
  if (Number.isNaN(server) || rtt > bestRttMs) return;
  bestRttMs = rtt;
  offsetMs = server + rtt / 2 - receivedAt;
}

export function serverNow() {
  return Date.now() + offsetMs;
}

// ---- calls ------------------------------------------------------------------------
// Client rule: retry 429 and 503 (and a lost answer) with exponential backoff and full
// jitter, never in a tight loop: a flash sale's crowd retrying in step is a flood.
const BACKOFF_BASE_MS = 300;
const BACKOFF_CAP_MS = 5000;

export function backoffMs(attempt) {
  const ceiling = Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** attempt);
  return Math.round(ceiling / 2 + Math.random() * (ceiling / 2));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One call. Resolves to {status, body, lost}: `lost` when no answer came (network error
// or a timeout): the request may or may not have run on the server.
export async function call(method, path, { token, headers = {}, timeoutMs = 8000 } = {}) {
  const h = { accept: "application/json", ...headers };
  if (token) h.authorization = `Bearer ${token}`;
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), timeoutMs);
  const sentAt = Date.now();
  try {
    const res = await fetch(API + path, { method, headers: h, signal: abort.signal });
    // Client rule: ids are 64-bit and come as strings; keep them strings (a JavaScript
    // number loses digits past 2^53). JSON.parse keeps strings as they are.
    const body = await res.json().catch(() => ({}));
    if (body && typeof body.server_time === "string") {
      learnClock(body.server_time, sentAt, Date.now());
    }
    return { status: res.status, body, lost: false };
  } catch (e) {
    return { status: 0, body: { code: "lost", message: String(e) }, lost: true };
  } finally {
    clearTimeout(timer);
  }
}

// A call retried on 429, 503 and lost answers (only safe for idempotent requests: reads,
// and the admission, which the server makes idempotent per buyer). `onWait(ms, answer)`
// is told about each pause. The answer carries `unsure` when an earlier try got no
// answer or a 503: that try may have run on the server, so a refusal that follows may
// only say what the server saw after it (see the buyer page's `buy`).
export async function callRetrying(method, path, opts = {}, onWait = () => {}) {
  const attempts = opts.attempts ?? 6;
  let answer;
  let unsure = false;
  for (let attempt = 0; attempt < attempts; attempt++) {
    answer = await call(method, path, opts);
    answer.unsure = unsure;
    if (!answer.lost && answer.status !== 429 && answer.status !== 503) return answer;
    unsure ||= answer.lost || answer.status === 503;
    if (attempt + 1 === attempts) break;
    const ms = backoffMs(attempt);
    onWait(ms, answer);
    await sleep(ms);
  }
  return answer;
}

// ---- what a buyer reads -----------------------------------------------------------
// Every error code of the contract, as a sentence.
const SENTENCES = {
  invalid_request: "That request was not understood.",
  unauthorized: "You are not signed in (or your sign-in expired).",
  forbidden: "You are not allowed to do that.",
  entry_required: "Please wait for your turn in the line before buying.",
  not_found: "We could not find that.",
  method_not_allowed: "That action is not available here.",
  not_started: "The sale has not started yet.",
  ended: "The sale is over.",
  sold_out: "Sold out: every voucher has been taken.",
  already_purchased: "You already have this voucher.",
  queue_not_open: "The line for this sale is not open yet.",
  order_expired: "The time to pay for this order ran out; the voucher went back on sale.",
  order_cancelled: "This order was cancelled; the voucher went back on sale.",
  order_paid: "This order is already paid.",
  order_rejected: "This order could not be completed.",
  already_paid: "This order is already paid.",
  payment_not_required: "This voucher needs no payment.",
  payment_mismatch: "The payment did not match the price.",
  payment_reused: "That payment was already used for another order.",
  // Shown while the call is retried (the page adds when) and after its last try: no
  // promise of another.
  rate_limited: "Too many tries at once.",
  unavailable: "The shop is very busy.",
  lost: "No answer from the shop.",
};

export function sentence(body) {
  return SENTENCES[body?.code] ?? body?.message ?? "Something went wrong.";
}

// An amount in a currency's minor unit, as "12.50 EUR" (two decimals), "5000 JPY" (none),
// "1.250 KWD" (three): the currency's own number of decimals.
export function money(amountMinor, currency) {
  let digits = 2;
  try {
    digits = new Intl.NumberFormat("en", { style: "currency", currency })
      .resolvedOptions().maximumFractionDigits;
  } catch { /* a code this browser does not know: two decimals */ }
  return `${(amountMinor / 10 ** digits).toFixed(digits)} ${currency}`;
}

export function human(ms) {
  if (ms <= 0) return "0s";
  const s = Math.ceil(ms / 1000);
  const [h, m, r] = [Math.floor(s / 3600), Math.floor((s % 3600) / 60), s % 60];
  if (h > 0) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m > 0) return `${m}m ${String(r).padStart(2, "0")}s`;
  return `${r}s`;
}

// Text only: whatever a title holds is shown as text, never parsed as markup.
export function show(id, text) {
  const el = document.getElementById(id);
  if (el && el.textContent !== String(text)) el.textContent = String(text);
}
