-- How often a buyer may buy a voucher again after an unpaid close (docs/design.md,
-- "Floods and bots"): with `rebuy_after_close`, one account could cancel and rebuy in a
-- loop and hold a unit unpaid for the whole sale. `rebuy_limit` unpaid closes (cancelled
-- or expired) leave the buyer free to buy again; after that many they hold their last
-- order for good. NULL (vouchers made before): the default, 2. A plain ADD COLUMN (MySQL
-- 8 has no ADD COLUMN IF NOT EXISTS): the migration runner applies each file once.
ALTER TABLE vouchers
    ADD COLUMN rebuy_limit TINYINT UNSIGNED NULL,
    ADD CONSTRAINT vouchers_rebuy_limit CHECK (rebuy_limit IS NULL OR rebuy_limit BETWEEN 1 AND 10);
