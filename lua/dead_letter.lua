-- Dead-lettering: move one orders-stream entry to the voucher's dead-letter stream, and
-- take its order out of the payment step.
--
-- KEYS[1] orders stream  seckill:{<voucher>}:orders
-- KEYS[2] dead letters   seckill:{<voucher>}:dead
-- KEYS[3] deadlines      seckill:{<voucher>}:deadlines
-- KEYS[4] closed hash    seckill:{<voucher>}:closed
-- KEYS[5] to settle      seckill:{<voucher>}:to_settle
-- ARGV[1] consumer group, ARGV[2] entry id, ARGV[3] reason, ARGV[4] delivery count,
-- ARGV[5] the entry's order id and ARGV[6] its buyer ('' both when the entry did not
-- parse as an order), ARGV[7..] the entry's original field/value pairs
--
-- Returns WRITTEN when the dead letter was written and the entry acked, NOT_PENDING when
-- the entry was no longer pending (another drainer already acked or dead-lettered it: writing a second
-- dead letter would only duplicate it).
--
-- Every key shares the {<voucher>} hash tag, so the copy and the XACK happen atomically
-- on one cluster slot: an entry is never acked without its dead letter, and never
-- dead-lettered twice. The only check comes before the first write.
--
-- Vouchers with a payment step (the three payment keys are simply absent otherwise): a
-- dead-lettered order has no row to record a close in, so it leaves the deadlines (it
-- never expires, never gives Redis a unit back) and the closes to settle, in this same
-- script, so that a payment racing it either closed the order before (its close is
-- carried below) or finds it no longer open (the payment is then due for refund). The
-- close Redis decided for it, if any, is carried in the dead letter (CLOSE): a paid
-- order keeps the payment that paid it, and a replay (lua/replay_dead_letter.lua) puts
-- the close back even after the sale's keys expired or Redis lost them, so the order is
-- written as it was closed (paid by that payment), never open again nor paid twice.

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- Results:
local WRITTEN = 1
local NOT_PENDING = 0
-- Fields a dead letter adds to the entry's own:
local SOURCE_ID = 'source_id'
local REASON = 'reason'
local DELIVERIES = 'deliveries'
local CLOSE = 'close'

local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 then
  return NOT_PENDING
end

local order, user = ARGV[5], ARGV[6]
local close = false
if order ~= '' then
  close = redis.call('HGET', KEYS[4], order)
end

local fields = {}
for i = 7, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
fields[#fields + 1] = SOURCE_ID
fields[#fields + 1] = ARGV[2]
fields[#fields + 1] = REASON
fields[#fields + 1] = ARGV[3]
fields[#fields + 1] = DELIVERIES
fields[#fields + 1] = ARGV[4]
if close then
  fields[#fields + 1] = CLOSE
  fields[#fields + 1] = close
end

redis.call('XADD', KEYS[2], '*', unpack(fields))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if order ~= '' then
  redis.call('ZREM', KEYS[3], order .. '\n' .. user)
  redis.call('SREM', KEYS[5], order)
end
return WRITTEN
