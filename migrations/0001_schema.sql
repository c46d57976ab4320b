-- Vouchers on sale and the orders admitted for them.
-- Works on MariaDB 10.11 and Aurora MySQL 8. Times are UTC.

CREATE TABLE IF NOT EXISTS vouchers (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    title       VARCHAR(200)    NOT NULL,
    stock       INT             NOT NULL,
    -- Decremented by the drainer by exactly the rows it inserts; the CHECK is the
    -- database's own guard against overselling (invariant 1).
    stock_left  INT             NOT NULL,
    begins_at   DATETIME(3)     NOT NULL,
    ends_at     DATETIME(3)     NOT NULL,
    created_at  DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (id),
    CONSTRAINT vouchers_stock_left_nonnegative CHECK (stock_left >= 0),
    CONSTRAINT vouchers_stock_left_within_stock CHECK (stock_left <= stock),
    CONSTRAINT vouchers_window_ordered CHECK (begins_at < ends_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS orders (
    -- Time-prefixed id issued at admission (see docs/design.md), never AUTO_INCREMENT:
    -- a redelivered order must hit the same primary key.
    id           BIGINT UNSIGNED NOT NULL,
    voucher_id   BIGINT UNSIGNED NOT NULL,
    user_id      VARCHAR(64)     NOT NULL,
    -- confirmed: holds a unit of stock; rejected: admitted in Redis but the database
    -- stock could not cover it (reason says why).
    status       ENUM('confirmed', 'rejected') NOT NULL,
    reason       VARCHAR(64)     NULL,
    admitted_at  DATETIME(3)     NOT NULL,
    created_at   DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (id),
    -- At most one order per user per voucher (invariant 2), whatever Redis says.
    UNIQUE KEY orders_one_per_user (voucher_id, user_id),
    KEY orders_by_voucher_status (voucher_id, status)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
