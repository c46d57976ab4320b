-- Order events for the rest of the shop (docs/design.md, "Order events"): every state an
-- order reaches is owed an event the moment its transition commits, so it is written in
-- the same transaction, by triggers, whatever statement made the change (the drainer's
-- batches, its settles and refunds, the webhook). The drainer publishes the rows to
-- EventBridge after they commit and deletes each once EventBridge took it
-- (order-drainer's `events`): at least once, and a transition that rolled back leaves no
-- row to publish.
--
-- `id` is the publishing order and each event's `sequence`: an order's transitions are
-- written under its row lock, one transaction after the other, so their ids grow in the
-- order they happened. `event_id` is stable (`<order id>:<state>`, a refund's also with
-- its payment id): the same transition is always the same id, and a consumer drops a
-- repeat by it.
--
-- A payment of no known order (no voucher: migrations/0008) is owed no event: it has
-- no order for a consumer to match, and `seckill reconcile` lists it.
--
-- The triggers read no table: a refund's buyer (the order's) and an order's amount (its
-- voucher's price) are joined when the row is published. A read here would be a locking
-- read inside the statement that holds the outbox's AUTO-INC lock (the table lock InnoDB
-- takes for an insert fired by an UPDATE or an INSERT ... SELECT, with MariaDB's and
-- MySQL 5.7's default `innodb_autoinc_lock_mode` = 1): a webhook's payment update held
-- a share lock on its order's row while it waited for the AUTO-INC lock, which a drainer
-- batch held while it waited for that row, and InnoDB broke the deadlock with "Failed to
-- read auto-increment value from storage engine".
--
-- Triggers run as their definer (the migrating user), so the functions' user needs no
-- right to write this table; the drainer reads and deletes it (shared/src/migrate.rs).
-- On Aurora with binary logging on, creating a trigger needs the cluster parameter
-- `log_bin_trust_function_creators` = 1 (docs/deploy.md). DROP then CREATE keeps the
-- file re-runnable.

CREATE TABLE IF NOT EXISTS order_events (
    id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    event_id     VARCHAR(200)    NOT NULL,
    order_id     BIGINT UNSIGNED NOT NULL,
    voucher_id   BIGINT UNSIGNED NOT NULL,
    user_id      VARBINARY(64)   NOT NULL,
    -- The order's state (orders.status) or the refund's (payments.outcome).
    state        VARCHAR(32)     NOT NULL,
    reason       VARCHAR(255)    NULL,
    -- A refund's amount (the payment's); an order's is its voucher's price, joined when
    -- the row is published, so a batch's writes read nothing more than before.
    amount_minor BIGINT          NULL,
    currency     CHAR(3)         NULL,
    payment_id   VARCHAR(128)    NULL,
    occurred_at  DATETIME(3)     NOT NULL,
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

DROP TRIGGER IF EXISTS orders_events_insert;
DROP TRIGGER IF EXISTS orders_events_update;
DROP TRIGGER IF EXISTS payments_events_insert;
DROP TRIGGER IF EXISTS payments_events_update;

DELIMITER //
CREATE TRIGGER orders_events_insert AFTER INSERT ON orders FOR EACH ROW
BEGIN
    -- An order closed in Redis before it was drained reached awaiting_payment there
    -- first: owed that event too, before its close.
    IF NEW.status IN ('paid', 'cancelled', 'expired') THEN
        INSERT INTO order_events (event_id, order_id, voucher_id, user_id, state, reason,
                                  occurred_at)
        VALUES (CONCAT(NEW.id, ':awaiting_payment'), NEW.id, NEW.voucher_id, NEW.user_id,
                'awaiting_payment', NULL, NEW.admitted_at);
    END IF;
    INSERT INTO order_events (event_id, order_id, voucher_id, user_id, state, reason,
                              occurred_at)
    VALUES (CONCAT(NEW.id, ':', NEW.status), NEW.id, NEW.voucher_id, NEW.user_id,
            NEW.status, NEW.reason, UTC_TIMESTAMP(3));
END//

CREATE TRIGGER orders_events_update AFTER UPDATE ON orders FOR EACH ROW
BEGIN
    IF NEW.status <> OLD.status THEN
        INSERT INTO order_events (event_id, order_id, voucher_id, user_id, state, reason,
                                  occurred_at)
        VALUES (CONCAT(NEW.id, ':', NEW.status), NEW.id, NEW.voucher_id, NEW.user_id,
                NEW.status, NEW.reason, UTC_TIMESTAMP(3));
    END IF;
END//

CREATE TRIGGER payments_events_insert AFTER INSERT ON payments FOR EACH ROW
BEGIN
    IF NEW.outcome IN ('refund_due', 'refused', 'refund_requested', 'refunded')
        AND NEW.voucher_id IS NOT NULL THEN
        INSERT INTO order_events (event_id, order_id, voucher_id, user_id, state, reason,
                                  amount_minor, currency, payment_id, occurred_at)
        VALUES (CONCAT(NEW.order_id, ':', NEW.outcome, ':', NEW.payment_id), NEW.order_id,
                NEW.voucher_id, '', NEW.outcome, NEW.reason, NEW.amount_minor, NEW.currency,
                NEW.payment_id, UTC_TIMESTAMP(3));
    END IF;
END//

CREATE TRIGGER payments_events_update AFTER UPDATE ON payments FOR EACH ROW
BEGIN
    IF NEW.outcome <> OLD.outcome AND NEW.voucher_id IS NOT NULL
        AND NEW.outcome IN ('refund_due', 'refused', 'refund_requested', 'refunded') THEN
        INSERT INTO order_events (event_id, order_id, voucher_id, user_id, state, reason,
                                  amount_minor, currency, payment_id, occurred_at)
        VALUES (CONCAT(NEW.order_id, ':', NEW.outcome, ':', NEW.payment_id), NEW.order_id,
                NEW.voucher_id, '', NEW.outcome, NEW.reason, NEW.amount_minor, NEW.currency,
                NEW.payment_id, UTC_TIMESTAMP(3));
    END IF;
END//
DELIMITER ;
