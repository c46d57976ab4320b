-- A voucher whose sale has started, or that has orders, cannot be deleted.
--
-- Orders admitted in Redis reach the database later; the drainer records an order of a
-- voucher the database does not know as `rejected`. Deleting a voucher mid-sale would
-- turn every 202 answered for it into `rejected`, and deleting one with orders would
-- orphan them. A trigger rather than a foreign key orders -> vouchers: the drainer must
-- still be able to record those rejected orders of unknown vouchers.
--
-- A voucher whose sale has not started and that has no orders can still be deleted
-- (a mistake fixed before the sale).
--
-- The trigger's body holds `;`, so this file changes the statement delimiter the way
-- the mysql client does (`DELIMITER`, understood by shared/src/migrate.rs). DROP then
-- CREATE keeps it re-runnable on MySQL 8 versions without CREATE TRIGGER IF NOT EXISTS.

DROP TRIGGER IF EXISTS vouchers_delete_guard;

DELIMITER //
CREATE TRIGGER vouchers_delete_guard BEFORE DELETE ON vouchers FOR EACH ROW
BEGIN
    -- Times are stored in UTC.
    IF OLD.begins_at <= UTC_TIMESTAMP(3) THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'voucher_delete_refused: its sale has started';
    END IF;
    IF EXISTS (SELECT 1 FROM orders WHERE voucher_id = OLD.id) THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'voucher_delete_refused: it has orders';
    END IF;
END//
DELIMITER ;
