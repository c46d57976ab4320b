// The buyer page: /app/sale.html?voucher=ID#token=JWT. One voucher's sale: its stock, a
// countdown by the server's clock, the buy button (only inside the window, and only
// once the waiting room lets this buyer in), then the order until it is settled.
import {
  backoffMs, callRetrying, human, money, sentence, serverNow, setToken, show, sleep, takeToken,
} from "./client.js";

const voucherId = new URLSearchParams(location.search).get("voucher") ?? "";
let token = takeToken();
let voucher = null; // the last read of GET /vouchers/{id}
let entryToken = null; // the waiting room's pass, once served
let entryExpires = 0; // when that pass lapses (server clock, ms)
let roomDone = false; // joined and finished waiting (served, sold out or ended)
let joining = false;
let roomFailures = 0; // failed joins in a row, and when the next may be tried
let roomRetryAt = 0;
let buying = false;
let order = null; // {order_id, status, pay_by?}
let saleOver = false; // sold out or ended, as an answer said
let card = null; // Stripe.js and its card element, once a checkout asked for them

const ORDER_SENTENCES = {
  pending: "Order received: it is being written down.",
  confirmed: "Confirmed: the voucher is yours.",
  awaiting_payment: "Reserved for you until the time below: pay to keep it.",
  paid: "Paid: the voucher is yours.",
  rejected: "This order could not be completed.",
  cancelled: "You cancelled this order; the voucher went back on sale.",
  expired: "The time to pay ran out; the voucher went back on sale.",
};
const SETTLED = new Set(["confirmed", "paid", "rejected", "cancelled", "expired"]);
// Orders that hold no unit; of those, the ones whose buyer may buy again where the
// voucher allows (a rejected order keeps its buyer: the server answers
// `already_purchased` naming it).
const CLOSED = new Set(["rejected", "cancelled", "expired"]);
const FREED = new Set(["cancelled", "expired"]);

// The order's payment can be made: reserved with a deadline, drained or not yet (the
// time to pay runs from the admission, not from the database's write).
const payable = (o) => o?.pay_by && ["pending", "awaiting_payment"].includes(o.status);

// ---- the sale -----------------------------------------------------------------------
async function readVoucher() {
  const a = await callRetrying("GET", `/vouchers/${encodeURIComponent(voucherId)}`);
  if (a.status === 200) {
    voucher = a.body;
    show("title", voucher.title);
    // A unit back on sale (an order cancelled or not paid in time) reopens a sale an
    // earlier answer said was sold out.
    if (voucher.stock_left > 0 && phase(serverNow()) === "open") saleOver = false;
  } else if (a.status === 404 || a.status === 400) {
    show("title", "There is no such sale.");
  } else {
    show("message", sentence(a.body));
  }
}

function phase(now) {
  if (!voucher) return "loading";
  if (now < Date.parse(voucher.begins_at)) return "not_started";
  if (now >= Date.parse(voucher.ends_at)) return "ended";
  return "open";
}

// Runs four times a second: countdown and button from the server's clock.
function render() {
  if (!voucher) return;
  const now = serverNow();
  const p = phase(now);
  const left = voucher.stock_left;
  show("stock", left > 0 ? `${left} of ${voucher.stock} left` : "Sold out");
  if (p === "not_started") {
    show("phase", "Starts in");
    show("countdown", human(Date.parse(voucher.begins_at) - now));
  } else if (p === "open") {
    show("phase", "On sale, ends in");
    show("countdown", human(Date.parse(voucher.ends_at) - now));
  } else {
    show("phase", "The sale is over.");
    show("countdown", "");
  }
  const room = voucher.entry_rate_per_s !== undefined;
  // A buyer whose order was cancelled or expired may buy again if the voucher says so.
  const free = !order || (voucher.rebuy_after_close && FREED.has(order.status));
  if (entryToken && now >= entryExpires && free) {
    // The pass lapsed: the line gives a fresh one (the place is kept).
    entryToken = null;
    roomDone = false;
  }
  const canBuy = token && p === "open" && left > 0 && free && !buying && !saleOver
    && (!room || entryToken);
  document.getElementById("buy").disabled = !canBuy;
  if (payable(order)) {
    show("order-detail", `Pay within ${human(Date.parse(order.pay_by) - now)}.`);
  }
}

// The token was refused (expired, or not a buyer's): every loop stops asking, and the
// form takes a new one.
function signedOut(body) {
  token = null;
  document.getElementById("token-form").hidden = false;
  show("message", sentence(body));
}

// ---- the waiting room ---------------------------------------------------------------
// Client rule: join once the queue opens and look again only when `expected_wait_ms` is
// over, never sooner; a join is idempotent (the place is kept), so a lost answer is
// simply asked again. `sold_out` ends the wait unless units may still come back.
async function waitInLine() {
  if (!voucher || voucher.entry_rate_per_s === undefined || roomDone || joining || !token) return;
  const opens = Date.parse(voucher.begins_at) - (voucher.queue_opens_before_s ?? 0) * 1000;
  if (serverNow() < opens || Date.now() < roomRetryAt) return;
  joining = true;
  document.getElementById("queue").hidden = false;
  const path = `/vouchers/${encodeURIComponent(voucherId)}/queue`;
  let a = await callRetrying("POST", path, { token });
  while (!roomDone) {
    if (a.status === 409 && a.body.code === "queue_not_open") {
      // Client rule: the line opens by the server's clock, which this page only
      // estimates: a join a little early is asked again shortly, never given up.
      show("wait", sentence(a.body));
      await sleep(1000 + Math.random() * 500);
      a = await callRetrying("POST", path, { token });
      continue;
    }
    if (a.status !== 200) {
      if (a.status === 401) signedOut(a.body);
      else show("message", sentence(a.body));
      if (a.status === 409) {
        roomDone = true; // the sale ended
        saleOver = true;
      } else {
        // Client rule: never ask again in a tight loop; the pause grows with each failure.
        roomRetryAt = Date.now() + backoffMs(roomFailures++);
      }
      break;
    }
    roomFailures = 0;
    const s = a.body;
    show("position", s.position);
    if (s.status === "served") {
      entryToken = s.entry_token;
      entryExpires = Date.parse(s.entry_expires_at);
      roomDone = true;
      // A unit that came back is offered to the earliest in line still looking: for a
      // while only.
      show("wait", s.offer_expires_at
        ? `A unit came back and is held for you until ${new Date(Date.parse(s.offer_expires_at)).toLocaleTimeString()}: buy now.`
        : "It is your turn: you may buy now.");
    } else if (s.status === "sold_out" && s.units_may_return) {
      // Orders still await payment: a unit comes back if one is not paid in time.
      show("wait", "Sold out for now: a unit may come back if an order is not paid.");
      await sleep(Math.max(1000, s.expected_wait_ms) + Math.random() * 250);
      a = await callRetrying("GET", path, { token });
    } else if (s.status === "sold_out" || s.status === "ended") {
      roomDone = true;
      saleOver = true;
      show("wait", sentence({ code: s.status }));
    } else {
      show("wait", `Expected wait: ${human(s.expected_wait_ms)}.`);
      // A little jitter so that a crowd served at once does not ask at once.
      await sleep(Math.max(500, s.expected_wait_ms) + Math.random() * 250);
      a = await callRetrying("GET", path, { token });
    }
  }
  joining = false;
}

// ---- buying -------------------------------------------------------------------------
async function buy() {
  buying = true;
  render();
  const headers = entryToken ? { "seckill-entry": entryToken } : {};
  // Client rule: the admission may be retried. The server keeps one order per buyer, so
  // a retry after a lost answer either gets this attempt's 202 or `already_purchased`
  // naming the order already held: never a second order.
  const a = await callRetrying(
    "POST", `/vouchers/${encodeURIComponent(voucherId)}/seckill`, { token, headers },
    (ms, ans) => show("message", `${sentence(ans.body)} Trying again in ${human(ms)}.`),
  );
  buying = false;
  if (a.status === 202) {
    show("message", "You got it! Your order is being written down.");
    await follow({ order_id: a.body.order_id, status: a.body.status });
  } else if (a.status === 409 && a.body.code === "already_purchased") {
    show("message", `${sentence(a.body)} (order ${a.body.order_id})`);
    await follow({ order_id: a.body.order_id, status: "pending" });
  } else if (a.lost || a.status === 503) {
    // Client rule: no answer is not a "no". The admission may have run: ask which order
    // this buyer holds before saying anything else.
    if (!(await lookUpMine())) show("message", sentence(a.body));
  } else if (a.unsure && ["sold_out", "ended"].includes(a.body.code) && (await lookUpMine(true))) {
    // Client rule: a refusal after a lost answer may be this buyer's own earlier try
    // having taken the last unit (an instance answers `sold_out` from memory without
    // asking who holds what): the order found is theirs.
  } else if (a.status === 401) {
    signedOut(a.body);
  } else if (a.status === 403 && a.body.code === "entry_required") {
    // The pass was refused (it lapsed, or the line's key changed): the line gives a
    // fresh one, keeping the place.
    entryToken = null;
    roomDone = false;
    show("message", sentence(a.body));
  } else if (a.status === 409 && a.body.code === "sold_out" && voucher?.entry_rate_per_s !== undefined) {
    // Client rule: with a waiting room, sold out is not the end while units may come
    // back: back to the line, which offers a returned unit to the earliest still
    // looking (the place is kept).
    entryToken = null;
    roomDone = false;
    show("message", sentence(a.body));
  } else {
    if (["sold_out", "ended"].includes(a.body.code)) saleOver = true;
    show("message", sentence(a.body));
  }
  render();
}

// The buyer's order for this voucher (found by voucher and buyer, so it works after a
// lost answer), shown and followed; true when it holds a unit (an earlier order they
// cancelled is shown, but is no answer to a purchase).
async function lookUpMine(announce = false) {
  const a = await callRetrying("GET", `/vouchers/${encodeURIComponent(voucherId)}/order`, { token });
  if (a.status !== 200) return false;
  const holds = !CLOSED.has(a.body.status);
  if (announce && holds) {
    show("message", `${sentence({ code: "already_purchased" })} (order ${a.body.order_id})`);
  }
  await follow(a.body);
  return holds;
}

// Shows the order and follows it until it is settled.
async function follow(o) {
  order = o;
  document.getElementById("order").hidden = false;
  for (;;) {
    show("order-id", order.order_id);
    show("order-status", order.status.replace("_", " "));
    show("order-detail", ORDER_SENTENCES[order.status] ?? "");
    document.getElementById("payment").hidden = !payable(order);
    if (!payable(order)) document.getElementById("card-payment").hidden = true;
    render();
    if (SETTLED.has(order.status)) return;
    await sleep(order.status === "pending" ? 1000 : 2000);
    const a = await callRetrying("GET", `/orders/${encodeURIComponent(order.order_id)}`, { token });
    if (a.status === 200) order = a.body;
    else if (a.status === 401) return signedOut(a.body);
    else if (a.status === 404) {
      // A pending order Redis can no longer place by its id: find it by voucher.
      const b = await callRetrying("GET", `/vouchers/${encodeURIComponent(voucherId)}/order`, { token });
      if (b.status === 200) order = b.body;
    }
  }
}

// Paying starts a checkout at the payment provider; only the provider's confirmation
// pays, so the page keeps following the order rather than believing the click.
// Both calls may be retried: starting a payment changes nothing (the order has one
// PaymentIntent, however often it is asked), and a cancel is answered the same however
// often it is asked.
async function pay() {
  const a = await callRetrying("POST", `/orders/${encodeURIComponent(order.order_id)}/pay`, { token });
  if (a.status !== 200) {
    show("message", sentence(a.body));
    return;
  }
  const amount = money(a.body.amount_minor, a.body.currency);
  if (a.body.client_secret && a.body.publishable_key && a.body.stripe_js) {
    try {
      await cardForm(a.body);
      show("message", `Checkout started: pay ${amount} by card below. This page updates when the payment is recorded.`);
    } catch (e) {
      show("message", `The card form could not be loaded (${e.message}): try Pay again.`);
    }
    return;
  }
  show("message", `Checkout started: pay ${amount} with the payment provider. This page updates when the provider confirms.`);
}

// Stripe.js, loaded from Stripe (the pages' security policy names its origin) the first
// time a checkout asks for it: the card is typed into Stripe's own element, so the
// number never reaches this page's script or the shop.
function loadScript(url) {
  return new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = url;
    s.onload = resolve;
    s.onerror = () => reject(new Error(`${url} did not load`));
    document.head.append(s);
  });
}

async function cardForm(checkout) {
  if (!card) {
    if (typeof window.Stripe !== "function") await loadScript(checkout.stripe_js);
    const stripe = window.Stripe(checkout.publishable_key);
    const element = stripe.elements().create("card");
    element.mount("#card-element");
    card = { stripe, element };
  }
  card.clientSecret = checkout.client_secret;
  document.getElementById("card-payment").hidden = false;
}

// Confirms the order's PaymentIntent with the card, as every Stripe page does (3-D
// Secure, where the bank asks for it, is Stripe.js's own step). A success here is the
// buyer's side only: the order is paid when Stripe's event reaches the shop, which the
// page sees by following the order.
async function confirmCard() {
  const button = document.getElementById("confirm-card");
  button.disabled = true;
  show("message", "Confirming the payment with Stripe…");
  let r;
  try {
    r = await card.stripe.confirmCardPayment(card.clientSecret, {
      payment_method: { card: card.element },
    });
  } catch (e) {
    r = { error: { message: String(e?.message ?? e) } };
  }
  button.disabled = false;
  const status = r.paymentIntent?.status;
  if (r.error) {
    show("message", `The payment did not go through: ${r.error.message ?? "the card was declined"}. Try another card.`);
  } else if (status === "succeeded" || status === "processing") {
    document.getElementById("card-payment").hidden = true;
    show("message", "Payment confirmed by Stripe: the order shows paid as soon as the shop has recorded it.");
  } else {
    show("message", `The payment is not complete (${status}): try again.`);
  }
}

async function cancel() {
  const a = await callRetrying("POST", `/orders/${encodeURIComponent(order.order_id)}/cancel`, { token });
  if (a.status === 200) order = a.body;
  show("message", a.status === 200 ? "Cancelled." : sentence(a.body));
}

// ---- start ----------------------------------------------------------------------------
async function start() {
  document.getElementById("buy").addEventListener("click", () => buy());
  document.getElementById("pay").addEventListener("click", () => pay());
  document.getElementById("cancel").addEventListener("click", () => cancel());
  document.getElementById("confirm-card").addEventListener("click", () => confirmCard());
  const form = document.getElementById("token-form");
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    setToken(document.getElementById("token-input").value);
    location.reload();
  });
  if (!token) form.hidden = false;
  await readVoucher();
  setInterval(render, 250);
  setInterval(waitInLine, 500);
  // A buyer coming back (another tab, a reload) sees the order already held.
  if (token && voucher) lookUpMine(true);
  // The stock left, live; slower once this buyer is done.
  for (;;) {
    await sleep(order && SETTLED.has(order.status) ? 10000 : 2000);
    await readVoucher();
  }
}

start();
