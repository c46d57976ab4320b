-- Take: the second half of moving units between two stock buckets of one voucher
-- (lua/give.lua or lua/close.lua took them from the donor and recorded the transfer).
-- Runs on the recipient bucket.
--
-- KEYS[1] sale hash  seckill:{<voucher>}:sale      (of the recipient bucket)
-- KEYS[2] received   seckill:{<voucher>}:received  (of the recipient bucket)
-- KEYS[3] offers     seckill:{<voucher>}:offers    (of the recipient bucket)
-- ARGV[1] transfer id, ARGV[2] its units
-- ARGV[3] what the units are for (the record's fourth word): '' for anyone;
--         LINE, a unit an order gave back, for a waiting room's line (held, as
--         lua/close.lua holds one in bucket 0); OFFER, a held unit going with its offer
--         to the offered buyer's bucket (held there for them alone until the offer
--         lapses, ARGV[4] ms; ARGV[5] the buyer)
--
-- HSETNX on the transfer id first: a transfer is added to the stock once, however often
-- it is retried (a caller that lost the reply, the drainer finishing it later). A
-- recipient whose sale is not loaded gets nothing written (a stock field alone would
-- pass for a live sale without a window): the record stays on the donor.
--
-- Returns TAKEN when the units were added now, ALREADY when this transfer had been
-- received before, NOT_LOADED when the recipient's sale is missing.

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
local TAKEN = 1
local ALREADY = 0
local NOT_LOADED = -1
local STOCK = 'stock'
local HELD = 'held'
local HELD_UNTIL = 'held_until'
local LINE = 'line'
local OFFER = 'offer'
-- How long a returned unit waits for the line (as in lua/close.lua), in ms.
local HOLD_MS = 60000
-- How long an offer's key outlives the offer, in ms: past any sale's retirement check.
local OFFERS_KEPT_MS = 86400000

if redis.call('EXISTS', KEYS[1]) == 0 then
  return NOT_LOADED
end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  -- Received before, maybe by a copy on another connection: written again (the same
  -- value), so that a durable caller's WAIT on this connection covers the receipt.
  redis.call('HSET', KEYS[2], ARGV[1], redis.call('HGET', KEYS[2], ARGV[1]))
  return ALREADY
end
local n = tonumber(ARGV[2])
redis.call('HINCRBY', KEYS[1], STOCK, n)
local kind = ARGV[3] or ''
if kind == LINE or kind == OFFER then
  local until_ms
  if kind == LINE then
    local t = redis.call('TIME')
    until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + HOLD_MS
  else
    until_ms = tonumber(ARGV[4])
    redis.call('ZADD', KEYS[3], until_ms, ARGV[5])
    redis.call('PEXPIREAT', KEYS[3], until_ms + OFFERS_KEPT_MS)
  end
  redis.call('HINCRBY', KEYS[1], HELD, n)
  local before = tonumber(redis.call('HGET', KEYS[1], HELD_UNTIL)) or 0
  redis.call('HSET', KEYS[1], HELD_UNTIL, math.max(before, until_ms))
end
return TAKEN
