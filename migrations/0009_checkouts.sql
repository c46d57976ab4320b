-- The payment a checkout started at the provider, one per order (docs/design.md, "Paid
-- means the provider said so"): `POST /orders/{id}/pay` with Stripe configured creates a
-- PaymentIntent for the order, and every later checkout of the order answers that same
-- one (the provider's idempotency key makes the creation itself idempotent at Stripe; this
-- row makes it so with any provider, and across the key's 24 hours). The primary key
-- decides a race of two checkouts: the first row stands, the other's intent is never
-- handed out. Running it again changes nothing.
CREATE TABLE IF NOT EXISTS checkouts (
    order_id   BIGINT UNSIGNED NOT NULL,
    provider   VARCHAR(16)     NOT NULL,
    -- The provider's payment id (Stripe: the PaymentIntent's `pi_...`).
    payment_id VARCHAR(128)    NOT NULL,
    created_at DATETIME(3)     NOT NULL,
    PRIMARY KEY (order_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
