-- Waiting-room positions, kept where a repair can read them (docs/design.md, "Floods and
-- bots"): the queue lives in Redis (`seckill:{<id>}:queue`), and each position a join
-- was answered with is written here before the answer, so that a queue Redis lost comes
-- back in the same order and nobody jumps it by rejoining first. One row per buyer and
-- voucher; a position belongs to one buyer. The primary key serves the restore's pages
-- (`position > :after ORDER BY position`) and its MAX(position). Running it again changes
-- nothing.
CREATE TABLE IF NOT EXISTS queue_positions (
    voucher_id BIGINT UNSIGNED NOT NULL,
    position   BIGINT UNSIGNED NOT NULL,
    user_id    VARBINARY(64)   NOT NULL,
    joined_at  DATETIME(3)     NOT NULL,
    PRIMARY KEY (voucher_id, position),
    UNIQUE KEY queue_one_per_buyer (voucher_id, user_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
