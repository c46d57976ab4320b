-- Refunds issued, not only listed (docs/design.md, "Refunds"): a payment to refund
-- (`refund_due`, `refused`) of a provider seckill can call (Stripe) is refunded by the
-- drainer's runs through the provider's API, once: `refund_requested` when the provider
-- took the request (its refund id kept), `refunded` when the provider says the money went
-- back (Stripe's `charge.refunded`). Payments of the generic format (`provider`
-- 'generic') stay listed for the operators, as before.
--
-- A run claims a payment before it calls the provider (`refund_next_at` moved past the
-- call, `refund_attempts` counted), so two runs at once never both ask; a failed call
-- keeps its error and the time of the next try (backing off). Each statement is
-- idempotent: applied again, it fails as already applied and the runner goes on.
ALTER TABLE payments
    MODIFY COLUMN outcome ENUM('received', 'paid', 'refund_due', 'failed', 'refused',
                               'refund_requested', 'refunded') NOT NULL;

ALTER TABLE payments
    ADD COLUMN provider        VARCHAR(16)  NOT NULL DEFAULT 'generic',
    ADD COLUMN refund_id       VARCHAR(128) NULL,
    ADD COLUMN refund_attempts INT          NOT NULL DEFAULT 0,
    ADD COLUMN refund_next_at  DATETIME(3)  NULL,
    ADD COLUMN refund_error    VARCHAR(255) NULL;

-- The refunds a run may issue now: a provider's payments at `refund_due` or `refused`,
-- by when they may next be tried.
ALTER TABLE payments
    ADD KEY payments_to_refund (provider, outcome, refund_next_at);
