-- Preload: make a voucher sellable in Redis, at creation or after Redis lost the sale.
-- Idempotent, never overwrites a live sale.
--
-- KEYS[1] sale hash     seckill:{<voucher>}:sale
-- KEYS[2] buyers hash   seckill:{<voucher>}:buyers
-- KEYS[3] orders stream seckill:{<voucher>}:orders
-- KEYS[4] deadlines     seckill:{<voucher>}:deadlines
-- KEYS[5] closed orders seckill:{<voucher>}:closed
-- KEYS[6] to settle     seckill:{<voucher>}:to_settle
-- KEYS[7] transfers     seckill:{<voucher>}:transfers
-- KEYS[8] received      seckill:{<voucher>}:received
-- ARGV[1] the database's stock_left, ARGV[2] total stock, ARGV[3] begins_ms,
-- ARGV[4] ends_ms, ARGV[5] consumer group name,
-- ARGV[6] settled: how many orders of this voucher the database held when stock_left was
--         read (their buyers are already in the buyers hash: the caller merged them)
-- ARGV[7] the payment window in ms ('' when the voucher has no payment step),
-- ARGV[8] '1' when a buyer whose order was cancelled or expired may buy again
-- ARGV[9] the voucher's stock buckets. Every key above is one bucket's (a
--         voucher of one bucket is its bucket 0); ARGV[1] and ARGV[6] are then that
--         bucket's share and its settled orders. With more than one bucket the sale hash
--         also records `buckets` (an instance that never saw the voucher learns from
--         bucket 0 where a buyer belongs), and the transfers and received hashes get
--         their sentinel (lua/give.lua, lua/take.lua name them).
-- ARGV[10] the waiting room's entry rate per second ('' when the voucher has none),
-- ARGV[11] how many seconds before the start its queue opens: recorded in the sale hash,
--         where lua/queue.lua reads them and an instance that never saw the voucher
--         learns, with its buckets, that buying needs an entry token.
-- ARGV[12] returned: of the settled orders, how many Redis closed with their unit given
--         back (cancelled or expired) before the drainer settled the close; a voucher
--         that lets buyers buy again names no buyer for them (lua/restore_buyers.lua).
--
-- Stock = stock_left - (HLEN(buyers) - settled): the orders admitted but not yet drained
-- (buyers the database had not settled) take units the database has not taken yet, and
-- the returned ones give back units it has not got back yet (the drainer settles a
-- close before it writes new orders, so the database's guard sees those units first).
-- Never below 0.
--
-- Returns CREATED when it created the sale, ALREADY_LIVE when the sale was already there
-- (its stock is live and must not be reset: a repair after admissions began would
-- oversell), BUYERS_LOST when
-- the buyers hash holds fewer buyers than the database settled, less the returned ones
-- (Redis lost it again while the caller was merging): nothing written, the caller
-- retries.

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- Results:
local CREATED = 1
local ALREADY_LIVE = 0
local BUYERS_LOST = -1
-- The sentinel member of the deadlines (score +inf: never due), closed and to-settle
-- keys:
local SENTINEL = '~'
-- Sale hash fields:
local STOCK = 'stock'
local TOTAL = 'total'
local BEGINS_MS = 'begins_ms'
local ENDS_MS = 'ends_ms'
local PAY_MS = 'pay_ms'
local REBUY = 'rebuy'
local BUCKETS = 'buckets'
local ROOM_RATE = 'room_rate'
local ROOM_OPENS_S = 'room_opens_s'
local SENTINELS = 'sentinels'

-- The deadlines, closed and to-settle keys always exist (a sentinel member; a deadline
-- of +inf, never due): the admission, probe and close scripts name them in KEYS, and
-- while a slot migrates, a script naming a key the source node does not have is refused
-- (TRYAGAIN) for as long as the migration lasts. The sale hash says so (SENTINELS), so
-- the drainer's probe need not make them again.
redis.call('ZADD', KEYS[4], 'NX', '+inf', SENTINEL)
redis.call('HSETNX', KEYS[5], SENTINEL, SENTINEL)
redis.call('SADD', KEYS[6], SENTINEL)
local buckets = tonumber(ARGV[9])
if buckets > 1 then
  redis.call('HSETNX', KEYS[7], SENTINEL, SENTINEL)
  redis.call('HSETNX', KEYS[8], SENTINEL, SENTINEL)
end

if redis.call('EXISTS', KEYS[1]) == 1 then
  -- The group may still be missing (a stream lost on its own); BUSYGROUP is fine.
  local ok, err = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[3], ARGV[5], '0', 'MKSTREAM')
  if not ok and not string.find(tostring(err), 'BUSYGROUP', 1, true) then
    return redis.error_reply(tostring(err))
  end
  redis.call('HSET', KEYS[1], SENTINELS, '1')
  return ALREADY_LIVE
end

local buyers = redis.call('HLEN', KEYS[2])
local settled = tonumber(ARGV[6])
if buyers + tonumber(ARGV[12]) < settled then
  return BUYERS_LOST
end
local stock = tonumber(ARGV[1]) - (buyers - settled)
if stock < 0 then
  stock = 0
end

-- The drainers' group first (from the very first entry), the sale hash last: if the
-- group cannot be made, no sale opens whose orders nobody could drain.
local ok, err = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[3], ARGV[5], '0', 'MKSTREAM')
if not ok and not string.find(tostring(err), 'BUSYGROUP', 1, true) then
  return redis.error_reply(tostring(err))
end
redis.call('HSET', KEYS[1], STOCK, string.format('%.0f', stock), TOTAL, ARGV[2],
  BEGINS_MS, ARGV[3], ENDS_MS, ARGV[4], SENTINELS, '1')
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[1], PAY_MS, ARGV[7], REBUY, ARGV[8])
end
if buckets > 1 then
  redis.call('HSET', KEYS[1], BUCKETS, ARGV[9])
end
if ARGV[10] ~= '' then
  redis.call('HSET', KEYS[1], ROOM_RATE, ARGV[10], ROOM_OPENS_S, ARGV[11])
end
return CREATED
