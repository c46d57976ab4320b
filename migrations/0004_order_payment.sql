-- Payment after admission (opt-in per voucher): orders wait for payment until a deadline
-- and give their unit of stock back when cancelled or expired. See docs/design.md,
-- "Unpaid orders give their stock back".
--
-- Existing rows stay valid: vouchers get NULL (no payment, orders end `confirmed` as
-- before) and `rebuy_after_close` 0; orders keep their status, with no deadline.

-- How long a buyer has to pay, in milliseconds (NULL: no payment step), and whether a
-- buyer whose order was cancelled or expired may buy the voucher again.
ALTER TABLE vouchers
    ADD COLUMN pay_within_ms INT NULL,
    ADD COLUMN rebuy_after_close TINYINT(1) NOT NULL DEFAULT 0,
    ADD CONSTRAINT vouchers_pay_within_positive CHECK (pay_within_ms IS NULL OR pay_within_ms > 0);

-- awaiting_payment and paid hold a unit, like confirmed; cancelled and expired gave it
-- back. `pay_by` is fixed at admission (admitted_at + pay_within_ms); `pay_ref` is the
-- payment's idempotency key.
ALTER TABLE orders
    MODIFY status ENUM('confirmed', 'rejected', 'awaiting_payment', 'paid', 'cancelled', 'expired') NOT NULL,
    ADD COLUMN pay_by DATETIME(3) NULL,
    ADD COLUMN pay_ref VARCHAR(128) NULL,
    ADD COLUMN closed_at DATETIME(3) NULL;

-- At most one order per user per voucher among the orders that still count (invariant
-- 2): a cancelled or expired order no longer does, so a voucher that allows buying again
-- can hold the buyer's closed order and their new one. `holder` is NULL for closed
-- orders, and a UNIQUE index allows any number of NULLs.
ALTER TABLE orders
    ADD COLUMN holder VARBINARY(64)
        AS (CASE WHEN status IN ('cancelled', 'expired') THEN NULL ELSE user_id END) STORED;
ALTER TABLE orders ADD UNIQUE KEY orders_one_holder (voucher_id, holder);
ALTER TABLE orders DROP INDEX orders_one_per_user;
ALTER TABLE orders ADD KEY orders_by_buyer (voucher_id, user_id);
