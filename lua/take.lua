-- Take: the second half of moving units between two stock buckets of one voucher
-- (lua/give.lua took them from the donor and recorded the transfer). Runs on the
-- recipient bucket.
--
-- KEYS[1] sale hash  seckill:{<voucher>}:sale      (of the recipient bucket)
-- KEYS[2] received   seckill:{<voucher>}:received  (of the recipient bucket)
-- ARGV[1] transfer id, ARGV[2] its units
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

if redis.call('EXISTS', KEYS[1]) == 0 then
  return NOT_LOADED
end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  -- Received before, maybe by a copy on another connection: written again (the same
  -- value), so that a durable caller's WAIT on this connection covers the receipt.
  redis.call('HSET', KEYS[2], ARGV[1], redis.call('HGET', KEYS[2], ARGV[1]))
  return ALREADY
end
redis.call('HINCRBY', KEYS[1], STOCK, tonumber(ARGV[2]))
return TAKEN
