-- Stock buckets (issue #16): a voucher's stock may be split over several Redis keys in
-- different hash slots, so one hot sale can use several cluster primaries. The database
-- keeps one row and one guard per voucher (`stock_left >= n`) whatever the buckets: it
-- only needs to remember how many there are, to find each bucket's keys again.
--
-- Existing rows get 1: one bucket, the voucher's keys of before.
ALTER TABLE vouchers
    ADD COLUMN buckets SMALLINT NOT NULL DEFAULT 1,
    ADD CONSTRAINT vouchers_buckets_range CHECK (buckets BETWEEN 1 AND 16);
