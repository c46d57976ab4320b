"""Schemathesis hooks for the contract run (tests/tests/it/contract_fuzz.rs).

Two things a generic fuzzer cannot know about seckill, both narrow:

- The payment provider signs its webhook events. A positive case of
  `POST /payments/webhook` is signed here exactly as the provider signs
  (`Seckill-Signature: t=<unix s>,v1=HMAC-SHA256(secret, "<t>.<raw body>")`) with the
  stack's secret (SECKILL_PAYMENT_WEBHOOK_SECRET), so the event handling behind the
  signature check is fuzzed too. Negative cases are sent as generated (401).
- Four rules of `POST /vouchers` compare two fields or read the clock, which JSON Schema
  cannot state (docs/openapi.yaml, NewVoucher). A schema-valid voucher refused with one
  of exactly these messages is not a failure; any other refusal still is.
- Schemathesis infers (from the paths alone) that `POST /vouchers` creates what
  `GET /vouchers/{id}/order` reads. It does not: that route is the caller's order for the
  voucher, and a voucher just created holds none, so it is `404 not_found` as the
  document says (its links go `POST /vouchers` -> `Buy` -> `GetMyOrderForVoucher`).
  Only that pair is excused; a 404 of any other link still fails.
- Likewise for the queue (`GET` and `POST /vouchers/{id}/queue`): a voucher just created
  has no waiting room unless asked (`entry_rate_per_s`), and nobody has joined one just
  created; both are `404 not_found` as documented. Excused only with exactly those two
  messages.
- A signed payment event for an order still waiting undrained in its stream is `503`
  with "is not drained yet: send this event again", as documented: the provider resends
  and a later delivery finds the order written. The local stack drains only when asked,
  so an order the fuzzer itself bought (it follows the links to `Buy`) can sit there for
  the whole run. Excused only on `POST /payments/webhook` with exactly that message; any
  other 5xx still fails.
"""

import hashlib
import hmac
import json
import os
import time

import schemathesis

QUEUE_NOT_THERE = ("has no waiting room", "you have not joined the queue")

NOT_DRAINED_YET = "is not drained yet: send this event again"

NOT_IN_SCHEMA = (
    "begins_at must be before ends_at",
    "ends_at must be in the future",
    "must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z",
    "buckets must not exceed stock",
)


def _raw_body(body):
    """The bytes requests sends for a generated JSON body."""
    data = getattr(body, "data", None)  # schemathesis' Binary
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    return json.dumps(body, allow_nan=False).encode()


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.operation.label != "POST /payments/webhook":
        return
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    secret = os.environ.get("SECKILL_PAYMENT_WEBHOOK_SECRET")
    if not secret:
        return
    try:
        raw = _raw_body(case.body)
    except (TypeError, ValueError):
        return
    t = str(int(time.time()))
    mac = hmac.new(secret.encode(), t.encode() + b"." + raw, hashlib.sha256).hexdigest()
    case.headers = dict(case.headers or {})
    case.headers["Seckill-Signature"] = f"t={t},v1={mac}"


@schemathesis.hook
def filter_failure(context, failure, case, response):
    if (
        case.operation.label == "POST /payments/webhook"
        and response.status_code == 503
        and type(failure).__name__ == "ServerError"
    ):
        try:
            return NOT_DRAINED_YET not in response.json().get("message", "")
        except ValueError:
            return True
    if type(failure).__name__ == "EnsureResourceAvailability":
        created = getattr(failure, "created_with", None)
        missing = getattr(failure, "not_available_with", None)
        queue = ("GET /vouchers/{id}/queue", "POST /vouchers/{id}/queue")
        if created == "POST /vouchers" and missing in queue:
            try:
                message = response.json().get("message", "")
            except ValueError:
                return True
            return not any(m in message for m in QUEUE_NOT_THERE)
        return not (created == "POST /vouchers" and missing == "GET /vouchers/{id}/order")
    if case.operation.label != "POST /vouchers" or response.status_code != 400:
        return True
    if type(failure).__name__ != "RejectedPositiveData":
        return True
    try:
        message = response.json().get("message", "")
    except ValueError:
        return True
    return not any(rule in message for rule in NOT_IN_SCHEMA)
