-- Retention: give a finished, fully drained sale's keys an expiry.
--
-- KEYS[1] sale hash     seckill:{<voucher>}:sale
-- KEYS[2] buyers hash   seckill:{<voucher>}:buyers
-- KEYS[3] orders stream seckill:{<voucher>}:orders
-- KEYS[4] dead letters  seckill:{<voucher>}:dead
-- KEYS[5] transactions  seckill:{<voucher>}:drain_tx
-- KEYS[6] repair lock   seckill:{<voucher>}:repair
-- KEYS[7] deadlines     seckill:{<voucher>}:deadlines
-- KEYS[8] closed orders seckill:{<voucher>}:closed
-- KEYS[9] to settle     seckill:{<voucher>}:to_settle
-- KEYS[10] transfers    seckill:{<voucher>}:transfers (bucketed vouchers)
-- KEYS[11] received     seckill:{<voucher>}:received
-- KEYS[12] grace        seckill:{<voucher>}:grace (lua/grace.lua; empty once nothing is
--                       open, but for an order a dead letter took away)
-- KEYS[13] rebuys       seckill:{<voucher>}:rebuys (lua/close.lua)
-- ARGV[1] consumer group, ARGV[2] retention (ms; 0: the keys are kept, only the check
-- is made)
--
-- Returns EXPIRING when the sale may be retired (its keys now expire, unless the
-- retention is 0), UNDRAINED when the stream still holds
-- undrained orders
-- (something pending, or an entry never delivered to the group), or orders still
-- waiting for payment or for their close to reach the database, or units this bucket
-- gave that have not reached their recipient: then nothing changes.
--
-- The drainer calls it when it retires a sale (over for a minute, its stream drained).
-- The check is made again here, in the same script as the expiries, so no order can be
-- admitted or left pending in between (admission is closed by the server's clock
-- anyway). A non-empty dead-letter stream never expires: it holds orders an operator
-- still has to look at. Every key shares the {<voucher>} tag. Loaded after
-- lua/lib/streams.lua (id_less, stream_group).

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- The sentinel member of the to-settle set (lua/preload.lua):
local SENTINEL = '~'
-- Results:
local EXPIRING = 1
local UNDRAINED = 0

if redis.call('EXISTS', KEYS[3]) == 1 then
  local newest = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
  local g = stream_group(KEYS[3], ARGV[1])
  if g == nil then
    if #newest > 0 then return UNDRAINED end
  elseif tonumber(g['pending']) > 0
    or (#newest > 0 and id_less(g['last-delivered-id'], newest[1][1])) then
    return UNDRAINED
  end
end

-- Open orders have finite deadlines (the sentinel's is +inf).
if redis.call('ZCOUNT', KEYS[7], '-inf', '(+inf') > 0
  or redis.call('SCARD', KEYS[9]) - redis.call('SISMEMBER', KEYS[9], SENTINEL) > 0
  or redis.call('HLEN', KEYS[10]) - redis.call('HEXISTS', KEYS[10], SENTINEL) > 0 then
  return UNDRAINED
end

local ttl = tonumber(ARGV[2])
if ttl <= 0 then
  return EXPIRING
end
for i = 1, #KEYS do
  if i ~= 4 or redis.call('XLEN', KEYS[4]) == 0 then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return EXPIRING
