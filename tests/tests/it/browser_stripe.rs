//! The buyer page paying by card with Stripe.js, in a real browser against the stack:
//! checkout answers the order's PaymentIntent with the publishable key and Stripe.js's
//! URL, the page loads that script under its content security policy, mounts the card
//! element, and confirms with `stripe.confirmCardPayment(client_secret, {payment_method:
//! {card}})`, as every Stripe page does; the order shows `paid` once Stripe's event
//! arrives.
//!
//! Stripe.js here is localstripe's stand-in (its card element is plain inputs, its 3-D
//! Secure step a dialog). It cannot confirm a card itself, so the test supplies only that
//! step: the page's call is handed to Stripe's own Node SDK, which confirms the
//! PaymentIntent at localstripe with the card number the buyer typed into the element;
//! where the bank asks for 3-D Secure, localstripe's own `confirmCardPayment` (its
//! dialog) takes over, as Stripe.js would. Everything else is the page's own code.

use std::time::{Duration, Instant};

use seckill_shared::domain::now_millis;
use seckill_tests::api::{Api, id_of};
use seckill_tests::browser::Browser;
use seckill_tests::stack::StackEnv;
use seckill_tests::stripe::{CARD_3DS, CARD_DECLINED, CARD_OK, Sdk, intent_event};
use serde_json::{Value, json};

/// Wraps the `Stripe` that Stripe.js defines so that `confirmCardPayment` hands its call
/// to the test (`__stripeAsked`) and resolves with what the test answers
/// (`__stripeAnswer(paymentIntent)`): Stripe.js's answer to that PaymentIntent.
const CONFIRM_BY_THE_TEST: &str = r#"
let real;
Object.defineProperty(window, "Stripe", {
  configurable: true,
  set(v) { real = v; },
  get() {
    if (!real) return undefined;
    return (key) => {
      const stripe = real(key);
      const authenticate = stripe.confirmCardPayment; // localstripe's 3-D Secure step
      stripe.confirmCardPayment = (secret, data) => new Promise((resolve) => {
        window.__stripeAsked = { secret, key, card: data.payment_method.card.value.card };
        window.__stripeAnswer = async (pi) => {
          if (pi.status === "requires_action") resolve(await authenticate(secret, data));
          else if (pi.last_payment_error) {
            resolve({ error: { ...pi.last_payment_error, payment_intent: pi } });
          } else resolve({ paymentIntent: pi });
        };
      });
      return stripe;
    };
  },
});
return true;
"#;

/// A buyer of a fresh voucher priced 19.99 EUR, on its page with the order bought and the
/// card form open: (the order id, its PaymentIntent as checkout answers it).
async fn at_the_card_form(b: &Browser, api: &Api, name: &str) -> (String, Value) {
    let v = api
        .create_voucher(
            name,
            3,
            -1_000,
            json!({"pay_within_s": 600, "price_minor": 1999, "currency": "EUR"}),
        )
        .await;
    let vid = id_of(&v);
    let sub = format!("{name}-{}", now_millis());
    let token = api.token(&sub, false);
    b.open(&format!(
        "{}/app/sale.html?voucher={vid}#token={token}",
        api.base()
    ))
    .await;
    assert_eq!(b.eval(CONFIRM_BY_THE_TEST).await, json!(true));
    b.wait_enabled("#buy", true, Duration::from_secs(10)).await;
    b.click("#buy").await;
    let order = b
        .wait_text("#order-id", "an order id", |t| {
            !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit())
        })
        .await;
    b.wait_text("#order-detail", "the time left to pay", |t| {
        t.starts_with("Pay within")
    })
    .await;
    b.click("#pay").await;
    b.wait_text("#message", "the card form", |t| {
        t.contains("pay 19.99 EUR by card below")
    })
    .await;
    // Checkout is idempotent: the test's own call answers the page's PaymentIntent.
    let (status, checkout) = api
        .call("POST", &format!("/orders/{order}/pay"), Some(&token), None)
        .await;
    assert_eq!(status.as_u16(), 200, "{checkout}");
    assert_eq!(
        checkout["publishable_key"], "pk_test_seckill_local",
        "{checkout}"
    );
    (order, checkout)
}

/// Types `number` into the card element (localstripe's inputs) and presses Pay now;
/// returns what the page asked Stripe.js to confirm.
async fn pay_with(b: &Browser, number: &str) -> Value {
    for (field, text) in [
        ("number", number),
        ("exp_month", "12"),
        ("exp_year", "34"),
        ("cvc", "123"),
        ("postal_code", "75001"),
    ] {
        let input = b
            .find(&format!("#card-element input[placeholder={field}]"))
            .await;
        input.send_keys(text).await.expect("typed into the card");
    }
    b.click("#confirm-card").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let asked = b.eval("return window.__stripeAsked ?? null;").await;
        if !asked.is_null() {
            return asked;
        }
        assert!(
            Instant::now() < deadline,
            "the page never called confirmCardPayment"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stripe's side of the page's call: the SDK confirms the PaymentIntent with the card
/// typed, and Stripe.js's answer goes back to the page.
async fn stripe_confirms(b: &Browser, sdk: &Sdk, checkout: &Value, asked: &Value) -> Value {
    assert_eq!(asked["secret"], checkout["client_secret"], "{asked}");
    let pi = checkout["payment_intent"]
        .as_str()
        .expect("a PaymentIntent");
    let number = asked["card"]["number"].as_str().expect("the card's number");
    let after = sdk.confirm(pi, number);
    b.eval(&format!("window.__stripeAnswer({after}); return true;"))
        .await;
    after
}

/// Stripe sends the PaymentIntent's success, signed by its SDK.
async fn stripe_sends_success(api: &Api, sdk: &Sdk, pi: &str) {
    let intent = sdk.intent(pi);
    assert_eq!(intent["status"], "succeeded", "{intent}");
    let body = intent_event("payment_intent.succeeded", &intent);
    let sig = sdk.sign(&sdk.webhook_secret, &body, None);
    let res = api
        .http
        .post(format!("{}/payments/stripe", api.base()))
        .header("content-type", "application/json")
        .header("Stripe-Signature", sig)
        .body(body)
        .send()
        .await
        .expect("the webhook answers");
    assert_eq!(res.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn browser_stripe_a_card_typed_into_stripe_s_element_pays_the_order() {
    Browser::run("stripe_card", |b| async move {
        let api = Api::new();
        let sdk = Sdk::new(&StackEnv::load());
        let (_order, checkout) = at_the_card_form(&b, &api, "Card seat").await;
        let asked = pay_with(&b, CARD_OK).await;
        assert_eq!(asked["card"]["number"], CARD_OK);
        assert_eq!(asked["key"], "pk_test_seckill_local");
        let after = stripe_confirms(&b, &sdk, &checkout, &asked).await;
        assert_eq!(after["status"], "succeeded", "{after}");
        b.wait_text("#message", "Stripe's confirmation", |t| {
            t.starts_with("Payment confirmed by Stripe")
        })
        .await;
        assert!(
            hidden(&b, "card-payment").await,
            "the card form is put away"
        );
        // Confirmed is the buyer's side; paid is the event's.
        assert_ne!(b.text("#order-status").await, "paid");
        stripe_sends_success(&api, &sdk, checkout["payment_intent"].as_str().unwrap()).await;
        b.wait_text("#order-status", "paid", |t| t == "paid").await;
        assert!(hidden(&b, "payment").await, "nothing left to pay");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn browser_stripe_a_card_that_needs_3_d_secure_is_authenticated_in_stripe_js_s_step() {
    Browser::run("stripe_3ds", |b| async move {
        let api = Api::new();
        let sdk = Sdk::new(&StackEnv::load());
        let (_order, checkout) = at_the_card_form(&b, &api, "3DS seat").await;
        let asked = pay_with(&b, CARD_3DS).await;
        let after = stripe_confirms(&b, &sdk, &checkout, &asked).await;
        assert_eq!(after["status"], "requires_action", "{after}");
        // localstripe's 3-D Secure dialog: the buyer completes it.
        let complete = b
            .client
            .find(fantoccini::Locator::XPath(
                "//button[text()='Complete authentication']",
            ))
            .await
            .expect("the 3-D Secure dialog");
        complete.click().await.expect("completed");
        b.wait_text("#message", "Stripe's confirmation", |t| {
            t.starts_with("Payment confirmed by Stripe")
        })
        .await;
        stripe_sends_success(&api, &sdk, checkout["payment_intent"].as_str().unwrap()).await;
        b.wait_text("#order-status", "paid", |t| t == "paid").await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn browser_stripe_a_declined_card_says_so_and_leaves_the_order_to_pay() {
    Browser::run("stripe_declined", |b| async move {
        let api = Api::new();
        let sdk = Sdk::new(&StackEnv::load());
        let (_order, checkout) = at_the_card_form(&b, &api, "Declined seat").await;
        let asked = pay_with(&b, CARD_DECLINED).await;
        let after = stripe_confirms(&b, &sdk, &checkout, &asked).await;
        assert_ne!(after["status"], "succeeded", "{after}");
        b.wait_text("#message", "the refusal", |t| {
            t.starts_with("The payment did not go through")
        })
        .await;
        assert!(
            !hidden(&b, "card-payment").await,
            "the form stays, for another card"
        );
        assert!(b.enabled("#confirm-card").await);
        assert_ne!(b.text("#order-status").await, "paid");
        assert!(!hidden(&b, "payment").await, "the order is still to pay");
    })
    .await;
}

/// The pages' policy names localstripe's origin (the stack's Stripe.js and API) for
/// scripts, frames and requests, and nothing else outside the page's own.
#[tokio::test]
async fn browser_stripe_the_pages_policy_names_stripe_s_origins_only() {
    let api = Api::new();
    let env = StackEnv::load();
    let stripe = env.get("STRIPE_API_BASE");
    let res = api
        .http
        .get(format!("{}/app/sale.html", api.base()))
        .send()
        .await
        .expect("the page");
    let policy = res.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    for want in [
        format!("script-src 'self' {stripe};"),
        format!("connect-src 'self' {stripe};"),
        format!("frame-src {stripe} https://hooks.stripe.com;"),
        "default-src 'none';".to_string(),
    ] {
        assert!(policy.contains(&want), "{want} not in {policy}");
    }
}

/// Whether the element `id` is hidden.
async fn hidden(b: &Browser, id: &str) -> bool {
    b.eval(&format!("return document.getElementById({id:?}).hidden;"))
        .await
        .as_bool()
        .expect("a flag")
}
