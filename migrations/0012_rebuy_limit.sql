-- How often a buyer may buy a voucher again after an unpaid close (docs/design.md,
-- "Floods and bots"): with `rebuy_after_close`, one account could cancel and rebuy in a
-- loop and hold a unit unpaid for the whole sale. `rebuy_limit` unpaid closes (cancelled
-- or expired) leave the buyer free to buy again; after that many they hold their last
-- order for good. NULL (vouchers made before): the default, 2. Running it again changes
-- nothing.
ALTER TABLE vouchers
    ADD COLUMN IF NOT EXISTS rebuy_limit TINYINT UNSIGNED NULL;
