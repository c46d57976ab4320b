//! Unit tests of `webhook`: signatures, and events read leniently.

use super::*;

const NOW: i64 = 1_795_000_000;

fn secrets() -> Secrets {
    Secrets::parse("whsec_current_0123456789,whsec_previous_0123456789").unwrap()
}

#[test]
fn a_signature_made_with_either_secret_is_accepted() {
    let body = br#"{"id":"evt_1"}"#;
    for secret in [
        &b"whsec_current_0123456789"[..],
        b"whsec_previous_0123456789",
    ] {
        let h = header(&[secret], NOW, body);
        assert_eq!(verify(&secrets(), Some(&h), body, NOW + 10), Ok(NOW));
    }
    // A sender rotating signs with both.
    let h = header(
        &[b"whsec_unknown_012345678", b"whsec_current_0123456789"],
        NOW,
        body,
    );
    assert_eq!(verify(&secrets(), Some(&h), body, NOW), Ok(NOW));
}

#[test]
fn a_changed_body_a_wrong_secret_or_a_stale_timestamp_is_refused() {
    let body = br#"{"id":"evt_1","amount_minor":100}"#;
    let h = header(&[b"whsec_current_0123456789"], NOW, body);
    let changed = br#"{"id":"evt_1","amount_minor":1}"#;
    assert_eq!(
        verify(&secrets(), Some(&h), changed, NOW),
        Err(SignatureError::Mismatch)
    );
    let other = header(&[b"whsec_other_0123456789ab"], NOW, body);
    assert_eq!(
        verify(&secrets(), Some(&other), body, NOW),
        Err(SignatureError::Mismatch)
    );
    assert_eq!(
        verify(&secrets(), Some(&h), body, NOW + TOLERANCE_S + 1),
        Err(SignatureError::OutsideTolerance(TOLERANCE_S + 1))
    );
    assert_eq!(
        verify(&secrets(), Some(&h), body, NOW - TOLERANCE_S - 1),
        Err(SignatureError::OutsideTolerance(-TOLERANCE_S - 1))
    );
    // The timestamp is signed: moving it breaks the signature.
    let moved = h.replacen(&format!("t={NOW}"), &format!("t={}", NOW + 5), 1);
    assert_eq!(
        verify(&secrets(), Some(&moved), body, NOW),
        Err(SignatureError::Mismatch)
    );
}

#[test]
fn malformed_headers_are_refused() {
    let body = b"{}";
    for h in [
        "",
        "t=abc,v1=00",
        "v1=00",
        &format!("t={NOW}"),
        &format!("t={NOW},v1=zz"),
        &format!("t={NOW},v1=0"),
        // Empty, or not one HMAC-SHA256 long (a byte short, a byte over).
        &format!("t={NOW},v1="),
        &format!("t={NOW},v1={}", "ab".repeat(31)),
        &format!("t={NOW},v1={}", "ab".repeat(33)),
        "garbage",
    ] {
        assert_eq!(
            verify(&secrets(), Some(h), body, NOW),
            Err(SignatureError::Malformed),
            "{h:?}"
        );
    }
    assert_eq!(
        verify(&secrets(), None, body, NOW),
        Err(SignatureError::Missing)
    );
}

#[test]
fn secrets_are_one_or_two_and_long_enough() {
    assert!(Secrets::parse("whsec_current_0123456789").is_ok());
    assert!(Secrets::parse("").is_err());
    assert!(Secrets::parse("short").is_err());
    assert!(Secrets::parse("a123456789abcdefgh,b123456789abcdefgh,c123456789abcdefgh").is_err());
    assert!(!format!("{:?}", secrets()).contains("whsec"));
}

#[test]
fn events_read_as_the_provider_sends_them() {
    let e: Event = serde_json::from_str(
        r#"{"id":"evt_1","type":"payment.succeeded","created":1795000000,
            "data":{"payment_id":"pay_1","order_id":"42","buyer":"alice",
                    "amount_minor":1999,"currency":"EUR"}}"#,
    )
    .unwrap();
    assert_eq!(e.kind, EventType::Succeeded);
    assert_eq!(e.data.amount_minor, 1999);
    assert!(
        serde_json::from_str::<Event>(
            r#"{"id":"evt_1","type":"payment.refunded","created":1,"data":{}}"#
        )
        .is_err()
    );
}

fn read(body: &str) -> Received {
    Received::read(body.as_bytes()).expect("a payment event")
}

#[test]
fn a_usable_event_reads_as_sent_and_unknown_fields_are_ignored() {
    let e = read(
        r#"{"id":"evt_1","type":"payment.succeeded","created":1795000000,"livemode":true,
            "data":{"payment_id":"pay_1","order_id":"42","buyer":"alice",
                    "amount_minor":1999.0,"currency":"eur","metadata":{"x":1}}}"#,
    );
    assert_eq!(e.kind, EventType::Succeeded);
    assert_eq!(e.payment_id, "pay_1");
    assert_eq!(e.payment.as_ref().map(PaymentRef::as_str), Some("pay_1"));
    assert_eq!(e.order, Ok(OrderId::new(42).unwrap()));
    assert_eq!(e.buyer, Ok(UserId::parse("alice").unwrap()));
    assert_eq!(
        (e.amount_minor, e.currency.as_deref()),
        (Some(1999), Some("EUR"))
    );
    assert_eq!(
        (e.event_id.as_str(), e.created_ms),
        ("evt_1", Some(1_795_000_000_000))
    );
    assert!(e.defects.is_empty(), "{:?}", e.defects);
    // An order id sent as a JSON integer is read too.
    let e = read(r#"{"type":"payment.failed","data":{"order_id":42}}"#);
    assert_eq!(e.order, Ok(OrderId::new(42).unwrap()));
}

#[test]
fn fields_outside_the_accepted_form_are_reasons_not_refusals() {
    let body = r#"{"id":"","type":"payment.succeeded","created":"soon",
        "data":{"payment_id":"pay 1","order_id":"-4","buyer":"a\u0001b",
                "amount_minor":19.5,"currency":"EURO"}}"#;
    let e = read(body);
    assert_eq!(e.payment, None);
    assert!(e.payment_id.starts_with('#') && e.payment_id.len() == 65);
    assert!(PaymentRef::parse(&e.payment_id).is_err());
    assert_eq!(
        read(body).payment_id,
        e.payment_id,
        "the same stand-in every time"
    );
    assert!(
        e.order.as_ref().unwrap_err().contains("\"-4\""),
        "{:?}",
        e.order
    );
    assert!(e.buyer.is_err());
    assert_eq!(
        (e.amount_recorded(), e.currency_recorded()),
        (0, NO_CURRENCY)
    );
    assert_eq!(e.created_ms, None);
    assert!(e.event_id.starts_with('#'));
    assert_eq!(e.defects.len(), 3, "{:?}", e.defects);
    for (defect, names) in e.defects.iter().zip(["\"pay 1\"", "19.5", "\"EURO\""]) {
        assert!(defect.contains(names), "{defect}");
    }
    // Nothing but a type: every field is missing, and the event still has a key.
    let bare = read(r#"{"type":"payment.succeeded"}"#);
    assert_eq!(bare.defects.len(), 3, "{:?}", bare.defects);
    assert!(bare.payment_id.starts_with('#'));
    assert!(bare.order.is_err() && bare.buyer.is_err());
    // Long values are cut in the reasons (the ledger's reason column is bounded).
    let long = read(&format!(
        r#"{{"type":"payment.failed","data":{{"payment_id":"{}"}}}}"#,
        "p".repeat(500)
    ));
    assert!(long.defects[0].chars().count() < 120, "{}", long.defects[0]);
}

#[test]
fn only_what_is_no_payment_event_is_refused() {
    for body in [
        "{",
        "[]",
        r#""payment.succeeded""#,
        r#"{"id":"evt_1","data":{}}"#,
        r#"{"type":"payment.refunded","data":{}}"#,
        r#"{"type":7}"#,
    ] {
        assert!(Received::read(body.as_bytes()).is_err(), "{body}");
    }
}

/// However many `v1` a header carries, the body is hashed at most once per secret: more
/// than [`MAX_SIGNATURES`] is refused before any hashing, even with a good one among
/// them, and up to that many are each compared.
#[test]
fn a_header_may_carry_a_few_signatures_not_a_flood() {
    let body = br#"{"id":"evt_1"}"#;
    let good = sign(b"whsec_current_0123456789", NOW, body);
    let wrong = "00".repeat(SIGNATURE_BYTES);
    let with = |wrong_ones: usize| {
        let mut h = format!("t={NOW}");
        for _ in 0..wrong_ones {
            h.push_str(&format!(",v1={wrong}"));
        }
        h + &format!(",v1={good}")
    };
    // The good one last of the most allowed.
    assert_eq!(
        verify(&secrets(), Some(&with(MAX_SIGNATURES - 1)), body, NOW),
        Ok(NOW)
    );
    assert_eq!(
        verify(&secrets(), Some(&with(MAX_SIGNATURES)), body, NOW),
        Err(SignatureError::Malformed)
    );
    assert_eq!(
        verify(&secrets(), Some(&with(10_000)), body, NOW),
        Err(SignatureError::Malformed)
    );
}
