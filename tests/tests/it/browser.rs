//! The buyer page and the operators' live view (`/app/...`) in a real browser: Debian's
//! chromium, headless, through chromedriver, against the running stack (seckill-http
//! behind the local gateway, the drainer, Redis, MariaDB). What is checked is what a
//! person would see: the countdown, the button, the sentences, the order's status.
//! A failing test leaves screenshots under `target/browser-screenshots/`.

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::StatusCode;
use seckill_shared::domain::now_millis;
use seckill_tests::api::{Api, id_of};
use seckill_tests::browser::Browser;
use seckill_tests::stack::{StackEnv, workspace_root};
use serde_json::{Value, json};

fn user(name: &str) -> String {
    format!("{name}-{}", now_millis())
}

/// A voucher on the stack, opening `opens_in_ms` from now (negative: already open).
async fn voucher(api: &Api, title: &str, stock: i64, opens_in_ms: i64, extra: Value) -> String {
    id_of(&api.create_voucher(title, stock, opens_in_ms, extra).await)
}

/// The buyer page of `voucher` for `sub`.
fn sale_page(api: &Api, voucher: &str, sub: &str) -> String {
    format!(
        "{}/app/sale.html?voucher={voucher}#token={}",
        api.base(),
        api.token(sub, false)
    )
}

fn is_order_id(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

#[tokio::test(flavor = "multi_thread")]
async fn browser_a_buyer_with_a_wrong_clock_waits_for_the_start_buys_and_sees_the_order_confirmed()
{
    Browser::run("buy_and_confirm", |b| async move {
        let api = Api::new();
        // Opening in 15 s: time for a loaded machine (six tests at a time on 2 cores) to
        // open the page before the start, which 6 s was not.
        let id = voucher(&api, "Browser coffee", 5, 15_000, json!({})).await;
        let alice = user("alice");
        // The buyer's clock is an hour fast: by it the sale would be over. The page
        // counts by the server's clock.
        b.skew_clock(3_600_000).await;
        b.open(&sale_page(&api, &id, &alice)).await;
        let skew = b.eval("return Date.now() - new Date().getTime()").await;
        assert!(
            skew.as_i64().is_some_and(|s| s > 3_500_000),
            "the skew holds: {skew}"
        );
        b.wait_text("#title", "the title", |t| t == "Browser coffee")
            .await;
        b.wait_text("#stock", "the stock", |t| t == "5 of 5 left")
            .await;

        // Before the start: the button is disabled and the countdown runs.
        assert!(!b.enabled("#buy").await, "the button waits for the start");
        let first = b
            .wait_text("#countdown", "a countdown", |t| t.ends_with('s'))
            .await;
        assert_eq!(b.text("#phase").await, "Starts in");
        let later = b
            .wait_text("#countdown", "the countdown moving", |t| t != first)
            .await;
        let secs = |t: &str| t.trim_end_matches('s').parse::<u32>().unwrap_or(99);
        assert!(secs(&later) < secs(&first), "{first} then {later}");
        assert!(secs(&first) <= 15, "counted by the server's clock: {first}");
        // A second tab of the same buyer, opened before the sale.
        let first_tab = b.client.window().await.expect("the first tab");
        let second_tab = b.open_tab(&sale_page(&api, &id, &alice)).await;
        b.wait_text("#title", "the title", |t| t == "Browser coffee")
            .await;
        b.to_tab(&first_tab).await;

        // It opens: the button comes on by itself, and buying gives an order id.
        b.wait_enabled("#buy", true, Duration::from_secs(25)).await;
        assert_eq!(b.text("#phase").await, "On sale, ends in");
        b.click("#buy").await;
        let order_id = b.wait_text("#order-id", "an order id", is_order_id).await;
        b.wait_text("#message", "the good news", |t| t.starts_with("You got it"))
            .await;
        assert!(
            !b.enabled("#buy").await,
            "one order per buyer: no second click"
        );
        let status = b.text("#order-status").await;
        assert!(status == "pending" || status == "confirmed", "{status}");

        // The drainer writes it; the page follows the order to confirmed.
        api.drain().await;
        b.wait_text("#order-status", "confirmed", |t| t == "confirmed")
            .await;
        b.wait_text("#order-detail", "the sentence", |t| t.contains("yours"))
            .await;

        // The second tab learnt nothing yet; buying there names the order held.
        b.to_tab(&second_tab).await;
        b.wait_enabled("#buy", true, Duration::from_secs(5)).await;
        b.click("#buy").await;
        let said = b
            .wait_text("#message", "already purchased", |t| {
                t.contains("already have this voucher")
            })
            .await;
        assert!(said.contains(&order_id), "{said} names {order_id}");
        b.wait_text("#order-id", "the same order", |t| t == order_id)
            .await;
        b.wait_text("#order-status", "confirmed", |t| t == "confirmed")
            .await;

        // A reload (the fragment is gone: the token stayed with the tab) shows it too.
        b.client.refresh().await.expect("a reload");
        b.wait_text("#order-id", "the order after a reload", |t| t == order_id)
            .await;
        assert!(
            !b.client
                .current_url()
                .await
                .unwrap()
                .as_str()
                .contains("token="),
            "the token left the address bar"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn browser_a_sold_out_sale_says_so_and_keeps_the_button_off() {
    Browser::run("sold_out", |b| async move {
        let api = Api::new();
        let id = voucher(&api, "Last one", 1, -1_000, json!({})).await;
        let (status, _) = api
            .call(
                "POST",
                &format!("/vouchers/{id}/seckill"),
                Some(&api.token(&user("early"), false)),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        b.open(&sale_page(&api, &id, &user("late"))).await;
        b.wait_text("#stock", "sold out", |t| t == "Sold out").await;
        assert!(!b.enabled("#buy").await, "nothing to buy");
        assert_eq!(b.text("#order-id").await, "", "no order");
    })
    .await;
}

/// A buyer whose try took the last unit but whose answer was lost: the page's retry is
/// answered `sold_out` (the instance that sold the unit remembers the sale sold out for a
/// second and asks Redis nothing), and the page must look up the order the buyer holds
/// rather than tell them they missed it. The first answer is dropped after the server
/// ran the admission.
#[tokio::test(flavor = "multi_thread")]
async fn browser_a_buyer_whose_answer_was_lost_on_the_last_unit_sees_their_order_not_sold_out() {
    Browser::run("lost_last_unit", |b| async move {
        let api = Api::new();
        let id = voucher(&api, "Only one", 1, -1_000, json!({})).await;
        let buyer = user("unlucky-network");
        b.intercept(
            r#"if (method === "POST" && path.endsWith("/seckill") && nth === 1) {
                 await real();
                 throw new TypeError("the answer was lost on the way");
               }"#,
        )
        .await;
        b.open(&sale_page(&api, &id, &buyer)).await;
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        b.click("#buy").await;
        let shown = b
            .wait_text("#order-id", "the order taken", is_order_id)
            .await;
        assert_eq!(b.calls("/seckill").await, 2, "one lost try, one retry");
        // The order the page shows is the one the server holds for this buyer.
        let (status, mine) = api
            .call(
                "GET",
                &format!("/vouchers/{id}/order"),
                Some(&api.token(&buyer, false)),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{mine}");
        assert_eq!(mine["order_id"], shown.as_str(), "{mine}");
        let message = b.text("#message").await;
        assert!(
            !message.starts_with("Sold out"),
            "the buyer holds the unit, yet the page says: {message}"
        );
    })
    .await;
}

/// Whether the element `id` is hidden.
async fn hidden(b: &Browser, id: &str) -> bool {
    b.eval(&format!("return document.getElementById({id:?}).hidden;"))
        .await
        .as_bool()
        .expect("a flag")
}

/// A voucher with a payment step whose drainer is behind: the order is still `pending`,
/// but its time to pay runs from the admission, so the page offers to pay at once (and
/// shows the price in the currency's own decimals: none for yen).
#[tokio::test(flavor = "multi_thread")]
async fn browser_a_pending_order_of_a_sale_with_a_payment_step_can_be_paid_before_the_drain() {
    Browser::run("pay_pending", |b| async move {
        let api = Api::new();
        let id = voucher(
            &api,
            "Yen seat",
            3,
            -1_000,
            json!({"pay_within_s": 600, "price_minor": 5000, "currency": "JPY"}),
        )
        .await;
        // The stack drains every second: under load, before the page asks.
        let _held = StackEnv::load().hold_drainer_back(&id);
        b.open(&sale_page(&api, &id, &user("early-payer"))).await;
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        b.click("#buy").await;
        b.wait_text("#order-id", "an order id", is_order_id).await;
        // Not drained: pending, with the deadline the admission set.
        b.wait_text("#order-detail", "the time left to pay", |t| {
            t.starts_with("Pay within 9m") || t.starts_with("Pay within 10m")
        })
        .await;
        assert_eq!(b.text("#order-status").await, "pending");
        assert!(!hidden(&b, "payment").await, "the payment block is offered");
        b.click("#pay").await;
        b.wait_text("#message", "the checkout", |t| t.contains("pay 5000 JPY"))
            .await;
    })
    .await;
}

/// A voucher that lets a buyer buy again after a close: after a cancel the button comes
/// back, and after a reload the page shows the cancelled order without calling it "yours
/// already"; the buyer buys again and gets a new order.
#[tokio::test(flavor = "multi_thread")]
async fn browser_a_buyer_who_cancelled_may_buy_again_where_the_voucher_allows_it() {
    Browser::run("rebuy", |b| async move {
        let api = Api::new();
        let id = voucher(
            &api,
            "Second chance",
            1,
            -1_000,
            json!({"pay_within_s": 600, "price_minor": 990, "currency": "EUR", "rebuy_after_close": true}),
        )
        .await;
        let page = sale_page(&api, &id, &user("changed-mind"));
        b.open(&page).await;
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        b.click("#buy").await;
        let first = b.wait_text("#order-id", "an order id", is_order_id).await;
        b.wait_text("#order-detail", "the time left to pay", |t| {
            t.starts_with("Pay within")
        })
        .await;
        b.click("#cancel").await;
        b.wait_text("#order-status", "cancelled", |t| t == "cancelled")
            .await;
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        // Coming back later: the cancelled order is shown, not announced as held.
        b.open(&page).await;
        b.wait_text("#order-status", "the cancelled order", |t| t == "cancelled")
            .await;
        let message = b.text("#message").await;
        assert!(
            !message.starts_with("You already have"),
            "a cancelled order is not a voucher held: {message}"
        );
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        b.click("#buy").await;
        b.wait_text("#order-id", "a new order id", |t| {
            is_order_id(t) && t != first
        })
        .await;
        b.wait_text("#order-status", "the new order held", |t| t == "pending")
            .await;
    })
    .await;
}

/// A rejected order (the database's stock could not cover it) keeps its buyer, even on
/// a voucher that lets a buyer buy again after a cancel: the button stays off (the
/// server would only answer `already_purchased`). The order lookups are made to say
/// `rejected` for the test.
#[tokio::test(flavor = "multi_thread")]
async fn browser_a_rejected_order_is_not_a_reason_to_buy_again() {
    Browser::run("rejected_no_rebuy", |b| async move {
        let api = Api::new();
        let id = voucher(
            &api,
            "Refused seat",
            3,
            -1_000,
            json!({"pay_within_s": 600, "price_minor": 990, "currency": "EUR", "rebuy_after_close": true}),
        )
        .await;
        b.intercept(
            r#"if (method === "GET" && path.startsWith("/orders/")) {
                 const answer = await real();
                 const body = await answer.json();
                 body.status = "rejected";
                 delete body.pay_by;
                 return fake(answer.status, body);
               }"#,
        )
        .await;
        b.open(&sale_page(&api, &id, &user("refused"))).await;
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        b.click("#buy").await;
        b.wait_text("#order-status", "rejected", |t| t == "rejected")
            .await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!b.enabled("#buy").await, "a rejected order keeps its buyer");
    })
    .await;
}

/// A `sold_out` answer is not the end when units are back on sale (an unpaid order
/// expired or was cancelled since): once the page reads stock left, the button comes
/// back. The first answer is made `sold_out` for the test.
#[tokio::test(flavor = "multi_thread")]
async fn browser_a_sold_out_answer_gives_way_when_the_stock_read_says_units_are_back() {
    Browser::run("units_back", |b| async move {
        let api = Api::new();
        let id = voucher(&api, "Came back", 2, -1_000, json!({})).await;
        b.intercept(
            r#"if (method === "POST" && path.endsWith("/seckill") && nth === 1) {
                 return fake(409, { code: "sold_out", message: "test" });
               }"#,
        )
        .await;
        b.open(&sale_page(&api, &id, &user("patient"))).await;
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        b.click("#buy").await;
        b.wait_text("#message", "sold out", |t| t.starts_with("Sold out"))
            .await;
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        b.click("#buy").await;
        b.wait_text("#order-id", "an order id", is_order_id).await;
    })
    .await;
}

/// A voucher with a waiting room whose queue a page joins a little early (its estimate
/// of the server's clock ahead of Redis's): `queue_not_open` is asked again shortly,
/// never taken as the end. The first two joins are answered `queue_not_open`.
#[tokio::test(flavor = "multi_thread")]
async fn browser_a_page_early_for_the_line_asks_again_until_it_opens() {
    Browser::run("early_for_line", |b| async move {
        let api = Api::new();
        let id = voucher(
            &api,
            "Early bird",
            5,
            -1_000,
            json!({"entry_rate_per_s": 100, "queue_opens_before_s": 60}),
        )
        .await;
        b.intercept(
            r#"if (method === "POST" && path.endsWith("/queue") && nth <= 2) {
                 return fake(409, { code: "queue_not_open", message: "test" });
               }"#,
        )
        .await;
        b.open(&sale_page(&api, &id, &user("early-bird"))).await;
        b.wait_text("#wait", "served", |t| t.starts_with("It is your turn"))
            .await;
        assert_eq!(b.calls(&format!("POST /vouchers/{id}/queue")).await, 3);
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        b.click("#buy").await;
        b.wait_text("#order-id", "an order id", is_order_id).await;
    })
    .await;
}

/// The waiting room's pass lapses (its `entry_expires_at`, made 1.5 s here) or is
/// refused (`entry_required`): the page asks the line again, which keeps the place and
/// gives a fresh pass, instead of offering a button that can only fail.
#[tokio::test(flavor = "multi_thread")]
async fn browser_a_lapsed_or_refused_entry_pass_is_renewed_from_the_line() {
    Browser::run("entry_renewed", |b| async move {
        let api = Api::new();
        let id = voucher(
            &api,
            "Short pass",
            5,
            -1_000,
            json!({"entry_rate_per_s": 100, "queue_opens_before_s": 60}),
        )
        .await;
        b.intercept(
            r#"if (method === "POST" && path.endsWith("/queue") && nth === 1) {
                 const answer = await real();
                 const body = await answer.json();
                 if (body.entry_expires_at) {
                   body.entry_expires_at = new Date(Date.now() + 1500).toISOString();
                 }
                 return fake(answer.status, body);
               }
               if (method === "POST" && path.endsWith("/seckill") && nth === 1) {
                 return fake(403, { code: "entry_required", message: "test" });
               }"#,
        )
        .await;
        let joins = format!("POST /vouchers/{id}/queue");
        b.open(&sale_page(&api, &id, &user("short-pass"))).await;
        b.wait_text("#wait", "served", |t| t.starts_with("It is your turn"))
            .await;
        // The pass lapses: the page joins again.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while b.calls(&joins).await < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the lapsed pass was never renewed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The buy is refused for want of a pass: the page joins again, then buys.
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        b.click("#buy").await;
        b.wait_text("#message", "the refusal", |t| {
            t.contains("wait for your turn")
        })
        .await;
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        assert_eq!(b.calls(&joins).await, 3, "a join after the refusal");
        b.click("#buy").await;
        b.wait_text("#order-id", "an order id", is_order_id).await;
    })
    .await;
}

/// A token the server refuses (expired mid-sale): the page stops asking (no join every
/// half second) and shows the form for a new one.
#[tokio::test(flavor = "multi_thread")]
async fn browser_a_refused_token_stops_the_page_asking_and_brings_the_form_back() {
    Browser::run("token_refused", |b| async move {
        let api = Api::new();
        let id = voucher(
            &api,
            "Signed out",
            5,
            -1_000,
            json!({"entry_rate_per_s": 100, "queue_opens_before_s": 60}),
        )
        .await;
        b.intercept(
            r#"if (method === "POST" && path.endsWith("/queue")) {
                 return fake(401, { code: "unauthorized", message: "test" });
               }"#,
        )
        .await;
        b.open(&sale_page(&api, &id, &user("expired-token"))).await;
        b.wait_text("#message", "the refusal", |t| t.contains("not signed in"))
            .await;
        assert!(!hidden(&b, "token-form").await, "the form for a new token");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            b.calls("/queue").await,
            1,
            "no join asked again with a refused token"
        );
        assert!(!b.enabled("#buy").await);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn browser_an_unpaid_order_shows_its_time_to_pay_and_can_be_cancelled() {
    Browser::run("pay_and_cancel", |b| async move {
        let api = Api::new();
        let id = voucher(
            &api,
            "Paid seat",
            1,
            -1_000,
            json!({"pay_within_s": 600, "price_minor": 1250, "currency": "EUR"}),
        )
        .await;
        b.open(&sale_page(&api, &id, &user("payer"))).await;
        b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
        b.click("#buy").await;
        b.wait_text("#order-id", "an order id", is_order_id).await;
        api.drain().await;
        b.wait_text("#order-status", "awaiting payment", |t| {
            t == "awaiting payment"
        })
        .await;
        b.wait_text("#order-detail", "the time left to pay", |t| {
            t.starts_with("Pay within 9m") || t.starts_with("Pay within 10m")
        })
        .await;
        // Paying starts the provider's checkout; only the provider's word pays.
        b.click("#pay").await;
        b.wait_text("#message", "the checkout", |t| t.contains("12.50 EUR"))
            .await;
        assert_eq!(b.text("#order-status").await, "awaiting payment");
        // Cancelling gives the unit back at once.
        b.click("#cancel").await;
        b.wait_text("#order-status", "cancelled", |t| t == "cancelled")
            .await;
        b.wait_text("#stock", "the unit back on sale", |t| t == "1 of 1 left")
            .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn browser_a_buyer_in_the_waiting_room_sees_the_place_and_buys_when_served() {
    Browser::run("waiting_room", |b| async move {
        let api = Api::new();
        // One buyer let in per second from a start 15 seconds away (room for a loaded
        // machine to open the page before this buyer's turn); the queue is open already.
        let id = voucher(
            &api,
            "Queued ticket",
            10,
            15_000,
            json!({"entry_rate_per_s": 1, "queue_opens_before_s": 60}),
        )
        .await;
        // Two buyers joined first: this one is third in line.
        for n in 0..2 {
            let (status, body) = api
                .call(
                    "POST",
                    &format!("/vouchers/{id}/queue"),
                    Some(&api.token(&user(&format!("ahead{n}")), false)),
                    None,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        b.open(&sale_page(&api, &id, &user("third"))).await;
        b.wait_text("#position", "a place in line", |t| t == "3")
            .await;
        b.wait_text("#wait", "an expected wait", |t| {
            t.starts_with("Expected wait")
        })
        .await;
        assert!(!b.enabled("#buy").await, "not served yet");
        b.wait_text_for("#wait", "served", Duration::from_secs(30), |t| {
            t.starts_with("It is your turn")
        })
        .await;
        b.wait_enabled("#buy", true, Duration::from_secs(5)).await;
        b.click("#buy").await;
        b.wait_text("#order-id", "an order id", is_order_id).await;
    })
    .await;
}

/// The live view during a 500-buyer sale run by the load tool (`seckill-load rush`)
/// beside the browser: admitted and waiting-to-drain move while it runs, and after the
/// drains everything is confirmed with nothing waiting.
#[tokio::test(flavor = "multi_thread")]
async fn browser_the_live_view_shows_a_500_buyer_sale_as_it_happens() {
    Browser::run("live_view", |b| async move {
        let api = Api::new();
        let id = voucher(&api, "Rush hour", 300, -1_000, json!({})).await;
        b.open(&format!(
            "{}/app/ops.html?voucher={id}#token={}",
            api.base(),
            api.token("operator", true)
        ))
        .await;
        let cell = |field: &str| format!("tr[data-voucher=\"{id}\"] td[data-field=\"{field}\"]");
        b.wait_text(&cell("admitted"), "the sale's row", |t| t == "0")
            .await;
        assert_eq!(b.text(&cell("stock_left")).await, "300 / 300");

        // The crowd, paced over 12.5 seconds (sold out after about seven and a half).
        let load = workspace_root().join("target/debug/seckill-load");
        let mut crowd = tokio::process::Command::new(&load)
            .args(["rush", &id, "--buyers", "500", "--rate", "40"])
            .args(["--user-prefix", &user("crowd")])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{} (cargo build --bin seckill-load): {e}", load.display()));
        let mut seen = BTreeSet::new();
        let mut waiting_seen = 0u64;
        let out = loop {
            let admitted: u64 = b.text(&cell("admitted")).await.parse().unwrap_or(0);
            seen.insert(admitted);
            let waiting: u64 = b.text(&cell("waiting")).await.parse().unwrap_or(0);
            waiting_seen = waiting_seen.max(waiting);
            if let Some(status) = crowd.try_wait().expect("the crowd runs") {
                let out = crowd.wait_with_output().await.expect("its output");
                assert!(status.success(), "seckill-load rush: {status}");
                break String::from_utf8_lossy(&out.stdout).into_owned();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        eprintln!("{out}admitted values seen on the page: {seen:?}");
        assert!(out.contains("\"202\": 300"), "300 admitted: {out}");
        // Moving: values between none and all while the crowd ran (about seven polls;
        // two leave room for a loaded machine).
        let between = seen.iter().filter(|&&n| n > 0 && n < 300).count();
        assert!(between >= 2, "the page showed the sale moving: {seen:?}");
        b.wait_text(&cell("admitted"), "all 300", |t| t == "300")
            .await;
        b.wait_text(&cell("stock_left"), "none left", |t| t.starts_with("0 /"))
            .await;
        assert!(waiting_seen > 0, "orders were seen waiting to drain");
        let rate = b.text(&cell("rate")).await;
        assert!(rate.parse::<f64>().is_ok(), "admissions/s shown: {rate:?}");

        // The drainer catches up; the view shows it.
        for _ in 0..5 {
            api.drain().await;
        }
        b.wait_text(&cell("confirmed"), "all confirmed", |t| t == "300")
            .await;
        b.wait_text(&cell("waiting"), "nothing waiting", |t| t == "0")
            .await;
        b.wait_text(&cell("lag"), "no lag", |t| t == "none").await;
        assert_eq!(b.text(&cell("dead_letters")).await, "0");

        // The charts the page draws of the last minutes: the admissions rose above
        // zero, the stock went down to none, each a line of many polls.
        let chart =
            |field: &str| format!("figure[data-voucher=\"{id}\"] svg[data-chart=\"{field}\"]");
        let label = b
            .wait_text(
                &format!("{} text", chart("stock")),
                "the stock chart at 0",
                |t| t.starts_with("stock left: 0 "),
            )
            .await;
        assert!(label.contains("(max 300)"), "{label}");
        let rate = b.text(&format!("{} text", chart("rate"))).await;
        let max: f64 = rate
            .split("(max ")
            .nth(1)
            .and_then(|m| m.trim_end_matches(')').parse().ok())
            .unwrap_or(0.0);
        assert!(max > 0.0, "admissions per second drawn: {rate}");
        for field in ["rate", "stock", "lag"] {
            let points = b
                .attr(&format!("{} polyline", chart(field)), "points")
                .await
                .unwrap_or_default();
            assert!(points.split(' ').count() >= 5, "{field}: {points:?}");
        }
        b.wait_text("#events", "the events owed", |t| {
            t.starts_with("Order events:")
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn browser_the_live_view_refuses_a_buyer_token() {
    Browser::run("live_view_refused", |b| async move {
        let api = Api::new();
        b.open(&format!(
            "{}/app/ops.html#token={}",
            api.base(),
            api.token(&user("nosy"), false)
        ))
        .await;
        b.wait_text("#message", "a refusal", |t| {
            t == "You are not allowed to do that."
        })
        .await;
        assert_eq!(b.text("#sales").await, "", "no figures shown");
    })
    .await;
}

/// The live view keeps only the sales the last answer lists (a sale that left the newest
/// ones shown loses its row, not its figures frozen), and shows the refunds due. From the
/// third poll on, the answer is made to list only the first sale.
#[tokio::test(flavor = "multi_thread")]
async fn browser_the_live_view_drops_a_sale_no_longer_listed_and_shows_refunds_due() {
    Browser::run("live_view_rows", |b| async move {
        let api = Api::new();
        let first = voucher(&api, "Stays", 5, -1_000, json!({})).await;
        let second = voucher(&api, "Leaves", 5, -1_000, json!({})).await;
        b.intercept(
            r#"if (method === "GET" && path.endsWith("/status") && nth >= 3) {
                 const answer = await real();
                 const body = await answer.json();
                 body.vouchers = body.vouchers.slice(0, 1);
                 return fake(answer.status, body);
               }"#,
        )
        .await;
        b.open(&format!(
            "{}/app/ops.html?voucher={first},{second}#token={}",
            api.base(),
            api.token("operator", true)
        ))
        .await;
        let rows = || async {
            b.eval("return [...document.querySelectorAll('#sales tr')].map((tr) => tr.dataset.voucher);")
                .await
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let shown = rows().await;
            if shown.as_array().is_some_and(|r| r.len() == 1) {
                assert!(
                    shown[0] == first.as_str() || shown[0] == second.as_str(),
                    "{shown}"
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the sale no longer listed kept its row: {shown}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(b.text("td[data-field=refunds_due]").await, "0");
    })
    .await;
}

/// The reference client's retries, in the page: answers of `503` and `429` are asked
/// again after growing pauses (exponential, with jitter; never a tight loop), until a
/// real answer comes. The page's `fetch` is replaced for the test so that the server
/// need not fail.
#[tokio::test(flavor = "multi_thread")]
async fn browser_the_client_backs_off_on_503_and_429_before_asking_again() {
    Browser::run("backoff", |b| async move {
        let api = Api::new();
        let id = voucher(&api, "Backoff", 1, -1_000, json!({})).await;
        // A page whose own script makes no calls (the live view without a token), so
        // that every fetch counted is the one under test.
        b.open(&format!("{}/app/ops.html", api.base())).await;
        b.wait_text("#token-form", "the token form", |t| !t.is_empty())
            .await;
        let script = format!(
            r#"const m = await import("./client.js");
            const real = window.fetch, times = [], fails = [503, 429, 503, 429];
            window.fetch = (...args) => {{
              times.push(performance.now());
              const status = fails[times.length - 1];
              if (status === undefined) return real(...args);
              return Promise.resolve(new Response(
                JSON.stringify({{ code: "unavailable", message: "test" }}),
                {{ status, headers: {{ "content-type": "application/json" }} }}));
            }};
            try {{
              const a = await m.callRetrying("GET", "/vouchers/{id}");
              return {{ status: a.status, gaps: times.slice(1).map((t, i) => t - times[i]) }};
            }} finally {{ window.fetch = real; }}"#
        );
        let out = b
            .eval(&format!("return (async () => {{ {script} }})();"))
            .await;
        assert_eq!(out["status"], 200, "{out}");
        let gaps: Vec<f64> = out["gaps"]
            .as_array()
            .expect("gaps")
            .iter()
            .map(|g| g.as_f64().expect("ms"))
            .collect();
        assert_eq!(gaps.len(), 4, "four failures, then the answer: {out}");
        // Pause k is between half and all of 300 ms x 2^k (jitter), so at least
        // 150, 300, 600, 1200 ms.
        for (k, gap) in gaps.iter().enumerate() {
            let floor = 150.0 * f64::from(1u32 << k);
            assert!(
                *gap >= floor - 5.0,
                "pause {k} was {gap} ms, under {floor}: {out}"
            );
        }
    })
    .await;
}
