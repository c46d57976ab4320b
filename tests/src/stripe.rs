//! Stripe's side, played with Stripe's own code: the official Node SDK
//! (`tests/stripe/sdk.mjs`, installed by `scripts/setup.sh`) against the stack's
//! localstripe (`STRIPE_API_BASE`, `STRIPE_SECRET_KEY`), and its test helper signing
//! webhook events with the stack's endpoint secret (`STRIPE_WEBHOOK_SECRET`). Nothing
//! here reads Stripe's docs our way: what the buyer's page confirms and what Stripe
//! signs is what Stripe's SDK does.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::StackEnv;
use crate::stack::workspace_root;

/// Test cards (Stripe's, which localstripe knows).
pub const CARD_OK: &str = "4242424242424242";
/// Attaches, then is declined when charged.
pub const CARD_DECLINED: &str = "4000000000000341";
/// Needs 3-D Secure.
pub const CARD_3DS: &str = "4000002500003155";

/// Stripe's Node SDK, pointed at the stack's Stripe.
pub struct Sdk {
    base: String,
    key: String,
    /// The stack's webhook endpoint secret (`whsec_...`).
    pub webhook_secret: String,
}

impl Sdk {
    pub fn new(env: &StackEnv) -> Sdk {
        Sdk {
            base: env.get("STRIPE_API_BASE"),
            key: env.get("STRIPE_SECRET_KEY"),
            webhook_secret: env.get("STRIPE_WEBHOOK_SECRET"),
        }
    }

    /// Runs `node sdk.mjs args...` with `stdin`: its stdout. Panics, with its stderr,
    /// when it fails.
    fn run(&self, args: &[&str], stdin: &str) -> String {
        let dir = workspace_root().join("tests/stripe");
        let mut child = Command::new("node")
            .arg(dir.join("sdk.mjs"))
            .args(args)
            .env("STRIPE_API_BASE", &self.base)
            .env("STRIPE_SECRET_KEY", &self.key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node runs (scripts/setup.sh installs tests/stripe's SDK)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("stdin written");
        let out = child.wait_with_output().expect("node finishes");
        assert!(
            out.status.success(),
            "node sdk.mjs {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8")
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.run(args, "")).expect("the SDK prints JSON")
    }

    /// The buyer's page: a card attached to PaymentIntent `intent`, confirmed. The
    /// PaymentIntent as it stands after (a declined card too).
    pub fn confirm(&self, intent: &str, card: &str) -> Value {
        self.json(&["confirm", intent, card])
    }

    /// The buyer passes (or fails) 3-D Secure.
    pub fn authenticate(&self, intent: &str, success: bool) -> Value {
        self.json(&[
            "authenticate",
            intent,
            if success { "true" } else { "false" },
        ])
    }

    /// The PaymentIntent `intent` as Stripe holds it.
    pub fn intent(&self, intent: &str) -> Value {
        self.json(&["intent", intent])
    }

    /// The charge `charge` as Stripe holds it.
    pub fn charge(&self, charge: &str) -> Value {
        self.json(&["charge", charge])
    }

    /// The refunds of PaymentIntent `intent`.
    pub fn refunds(&self, intent: &str) -> Vec<Value> {
        match self.json(&["refunds", intent]) {
            Value::Array(list) => list,
            other => panic!("refunds: {other}"),
        }
    }

    /// The `Stripe-Signature` header the SDK's test helper makes for `payload` with
    /// `secret`, at `timestamp` (unix s; now when `None`).
    pub fn sign(&self, secret: &str, payload: &str, timestamp: Option<i64>) -> String {
        let at = timestamp.map(|t| t.to_string());
        let mut args = vec!["sign", secret];
        if let Some(t) = &at {
            args.push(t);
        }
        self.run(&args, payload).trim().to_string()
    }
}

/// The event Stripe sends when PaymentIntent `intent` (as fetched) reaches `kind`
/// (`payment_intent.succeeded`, ...): localstripe sends no PaymentIntent events itself.
pub fn intent_event(kind: &str, intent: &Value) -> String {
    let id = format!(
        "evt_{}_{}",
        intent["id"].as_str().unwrap_or("none"),
        kind.rsplit('.').next().unwrap_or(kind)
    );
    let created = seckill_shared::domain::now_millis() / 1000;
    seckill_shared::webhook::stripe::event(&id, kind, created, intent.clone()).to_string()
}
