-- User ids are compared byte for byte, as Redis compares them.
--
-- `utf8mb4_bin` is a PAD SPACE collation on MariaDB and MySQL alike: `alice` and
-- `alice ` were one key to the orders table's UNIQUE (voucher_id, user_id) but two
-- buyers to Redis, so the second's order could never be written; and the repair's paging
-- (`user_id > :after`) skipped such neighbours. No NO PAD collation has the same name on
-- MariaDB 10.11 and MySQL 8, so the column becomes binary. Readers select
-- `CONVERT(user_id USING utf8mb4)` to keep getting a string from the Data API (a binary
-- column comes back as a blob). The bytes of existing rows are kept as they are; the
-- length limit stays 64 bytes (the edge refuses longer ids, shared/src/domain.rs).

ALTER TABLE orders MODIFY user_id VARBINARY(64) NOT NULL;
