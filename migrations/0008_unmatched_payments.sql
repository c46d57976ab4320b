-- Payments whose event names no order a voucher has (docs/design.md, "Paid means the
-- provider said so"). The money was taken all the same, so the payment is recorded
-- (outcome `refused`, with the reason) without a voucher, and without an order when the
-- event named none readably; `seckill status` and `seckill reconcile` list these rows
-- (voucher_id IS NULL: one range of payments_by_voucher_outcome). Running it again
-- changes nothing.
ALTER TABLE payments
    MODIFY COLUMN order_id BIGINT UNSIGNED NULL,
    MODIFY COLUMN voucher_id BIGINT UNSIGNED NULL;
