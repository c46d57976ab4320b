-- Payments confirmed by the payment provider (its signed webhook, see docs/design.md,
-- "Paid means the provider said so"). The buyer no longer marks an order paid.
--
-- A voucher with a payment step gets a price the provider's amount is checked against.
-- Existing rows keep NULL: a payment for such a voucher is refused as not matching
-- (record of it kept) until an admin sets a price.
ALTER TABLE vouchers
    ADD COLUMN price_minor BIGINT NULL,
    ADD COLUMN currency CHAR(3) NULL,
    ADD CONSTRAINT vouchers_price_positive CHECK (price_minor IS NULL OR price_minor > 0),
    ADD CONSTRAINT vouchers_price_and_currency CHECK ((price_minor IS NULL) = (currency IS NULL));

-- Every payment the provider told us of, once per provider payment id: the primary key
-- is what makes one payment pay at most one order, however often and in whatever
-- order its events arrive.
--   received     recorded, its close not yet decided (a crash in between: the
--                provider delivers again and the decision is made then)
--   paid         it paid its order
--   refund_due   it arrived after its order closed (expired or cancelled), or after
--                another payment paid the order: to refund, never applied
--   failed       the provider says the attempt failed; nothing to do
--   refused      its amount or currency did not match the voucher's price
CREATE TABLE IF NOT EXISTS payments (
    payment_id   VARCHAR(128)    NOT NULL,
    order_id     BIGINT UNSIGNED NOT NULL,
    voucher_id   BIGINT UNSIGNED NOT NULL,
    amount_minor BIGINT          NOT NULL,
    currency     CHAR(3)         NOT NULL,
    outcome      ENUM('received', 'paid', 'refund_due', 'failed', 'refused') NOT NULL,
    reason       VARCHAR(255)    NULL,
    -- The last event that changed the row (the provider's event id).
    event_id     VARCHAR(128)    NOT NULL,
    received_at  DATETIME(3)     NOT NULL,
    decided_at   DATETIME(3)     NULL,
    PRIMARY KEY (payment_id),
    KEY payments_by_order (order_id),
    KEY payments_by_voucher_outcome (voucher_id, outcome)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
