-- Waiting rooms (docs/design.md, "Floods and bots"): a voucher may make its buyers queue
-- before the sale and let them in at a set rate. Both columns NULL: no room (every
-- voucher created before keeps none); both set: the room's entry rate per second and how
-- many seconds before the start buyers may join.
ALTER TABLE vouchers
    ADD COLUMN entry_rate_per_s INT NULL,
    ADD COLUMN queue_opens_before_s INT NULL,
    ADD CONSTRAINT vouchers_room_both CHECK ((entry_rate_per_s IS NULL) = (queue_opens_before_s IS NULL)),
    ADD CONSTRAINT vouchers_room_rate CHECK (entry_rate_per_s IS NULL OR entry_rate_per_s BETWEEN 1 AND 100000),
    ADD CONSTRAINT vouchers_room_opens CHECK (queue_opens_before_s IS NULL OR queue_opens_before_s BETWEEN 0 AND 86400);
