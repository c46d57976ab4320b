-- The waiting room: join it, or look up one's place in it (docs/design.md, "Floods and
-- bots"). One call per request, on the voucher's slot; nothing scans the queue.
--
-- KEYS[1] sale hash  seckill:{<voucher>}:sale   (bucket 0's: window, room, stock,
--                    held units, see below)
-- KEYS[2] queue hash seckill:{<voucher>}:queue  user id -> position (1, 2, 3, ...)
-- KEYS[3] offers     seckill:{<voucher>}:offers  user id scored by when their offer of
--                    a returned unit lapses (ms)
-- KEYS[4] waiters    seckill:{<voucher>}:waiters user id scored by position: served,
--                    without an order, looking at a sale sold out to them
-- KEYS[5] looked     seckill:{<voucher>}:looked  user id -> their last such look (ms),
--                    or PASSED once an offer of theirs lapsed
-- KEYS[6] buyers     seckill:{<voucher>}:buyers  (bucket 0's: user id -> order id)
-- ARGV[1] the user id
-- ARGV[2] '1' to join (a position is given at the first join and kept ever after),
--         '0' to look only, '2' to look as a buyer seckill-http found the voucher sold
--         out to (a voucher of several buckets, whose stock this slot cannot see)
-- ARGV[3] how long the queue is kept after the sale's end, in ms
-- ARGV[4] how recent a waiter's last look must be for them to count as still looking, ms
-- ARGV[5] how long an offer of a returned unit holds, ms
--
-- A position is the sale hash's `queue_next` counter, incremented at the first join:
-- positions are 1..n in the order Redis ran the joins, whoever retries how often. The
-- counter is also the sign that the queue is whole: a sale hash without it (a new sale,
-- or one a repair rebuilt) or with it but no queue (Redis lost the queue) answers
-- NEEDS_RESTORE, writing nothing else, and seckill-http rebuilds the queue from the
-- positions the database holds (each join's answer was written there first), then sets
-- the counter past them. Until then nobody joins, so nobody who rejoins first after a
-- loss jumps the line.
--
-- Returned units go to the line, not to the fastest (lua/close.lua holds them here, in
-- bucket 0, whichever bucket gave them back): a unit an order gives back is `held` in
-- the sale hash, for the line alone
-- until `held_until` (and, once offered, until the offer lapses). Each look here first
-- drops the offers that lapsed (their holders had their turn and are not offered again),
-- then records the caller as waiting if the sale is sold out to them (one bucket: its
-- stock, less the units held, is gone; several: ARGV[2] is '2'), then offers each
-- held unit no offer holds yet to the earliest waiting position whose last look is
-- recent (earlier ones that stopped looking leave the waiters). Looking often gains
-- nothing: only the position orders the waiters. lua/admit.lua lets an offer's holder
-- take a held unit and everyone else only the units not held; a holder of another
-- bucket takes it through lua/give.lua, which moves it with the offer.
--
-- Returns {result, position (0 when none), the units bucket 0 has for the caller (its
-- stock, less the units held for others), buckets, now ms, begins ms, ends ms, entry
-- rate per s, opens before s, when the caller's offer lapses (0: none), units held};
-- only {result} for NOT_LOADED, NO_ROOM and NEEDS_RESTORE.

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- Results:
local QUEUED = 0
local NOT_LOADED = 1
local NO_ROOM = 2
local NOT_OPEN = 3
local ENDED = 4
local NOT_JOINED = 5
local NEEDS_RESTORE = 6
-- Sale hash fields:
local STOCK = 'stock'
local BEGINS_MS = 'begins_ms'
local ENDS_MS = 'ends_ms'
local BUCKETS = 'buckets'
local ROOM_RATE = 'room_rate'
local ROOM_OPENS_S = 'room_opens_s'
local HELD = 'held'
local HELD_UNTIL = 'held_until'
local QUEUE_NEXT = 'queue_next'
-- The looked hash's mark of a waiter whose offer lapsed:
local PASSED = 'passed'
-- Waiters and lapsed offers one call goes through at most.
local MOST = 32

local sale = redis.call('HMGET', KEYS[1], STOCK, BEGINS_MS, ENDS_MS, BUCKETS, ROOM_RATE,
  ROOM_OPENS_S, HELD, HELD_UNTIL, QUEUE_NEXT)
local stock = tonumber(sale[1])
local begins = tonumber(sale[2])
local ends = tonumber(sale[3])
if not stock or not begins or not ends then
  return { NOT_LOADED }
end
local rate = tonumber(sale[5])
local opens_s = tonumber(sale[6])
if not rate or not opens_s then
  return { NO_ROOM }
end
local buckets = tonumber(sale[4]) or 1
local counter = tonumber(sale[9])
if not counter then
  return { NEEDS_RESTORE }
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local result = QUEUED
local position = tonumber(redis.call('HGET', KEYS[2], ARGV[1]))
if not position and counter > 0 and redis.call('EXISTS', KEYS[2]) == 0 then
  -- The queue is gone but positions were given: rebuilt before anyone joins again.
  redis.call('HDEL', KEYS[1], QUEUE_NEXT)
  return { NEEDS_RESTORE }
end
if not position then
  if ARGV[2] ~= '1' then
    result = NOT_JOINED
  elseif now < begins - opens_s * 1000 then
    result = NOT_OPEN
  elseif now >= ends then
    result = ENDED
  else
    position = redis.call('HINCRBY', KEYS[1], QUEUE_NEXT, 1)
    if redis.call('HSET', KEYS[2], ARGV[1], position) == 1 and position == 1 then
      redis.call('PEXPIREAT', KEYS[2], ends + tonumber(ARGV[3]))
    end
  end
end
if result ~= QUEUED then
  return { result, position or 0, stock, buckets, now, begins, ends, rate, opens_s, 0, 0 }
end

-- The line for returned units (see the header).
local user = ARGV[1]
local keep_until = ends + tonumber(ARGV[3])
local held = tonumber(sale[7]) or 0
local live = 0
local mine = nil
if held > 0 then
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, MOST)
  for _, u in ipairs(lapsed) do
    redis.call('ZREM', KEYS[3], u)
    redis.call('ZREM', KEYS[4], u)
    redis.call('HSET', KEYS[5], u, PASSED)
  end
  live = redis.call('ZCOUNT', KEYS[3], now, '+inf')
  mine = tonumber(redis.call('ZSCORE', KEYS[3], user))
end
local reserved = held
if now >= (tonumber(sale[8]) or 0) then
  reserved = live
end
local plain = stock - reserved

-- The caller is waiting: served, sold out to, without an order or an offer, and never
-- offered a unit they let lapse.
local served_at = begins + math.ceil(math.max(0, position - rate) * 1000 / rate)
local sold_out = plain <= 0
if buckets > 1 then
  sold_out = ARGV[2] == '2'
end
if now >= served_at and sold_out and not mine and redis.call('HEXISTS', KEYS[6], user) == 0
    and redis.call('HGET', KEYS[5], user) ~= PASSED then
  if redis.call('ZADD', KEYS[4], position, user) == 1 then
    redis.call('PEXPIREAT', KEYS[4], keep_until)
  end
  if redis.call('HSET', KEYS[5], user, now) == 1 then
    redis.call('PEXPIREAT', KEYS[5], keep_until)
  end
end

-- Held units nobody holds an offer of: to the earliest waiters still looking.
local free = held - live
local seen = 0
while free > 0 and seen < MOST do
  local first = redis.call('ZRANGE', KEYS[4], 0, 0)
  if #first == 0 then
    break
  end
  local u = first[1]
  seen = seen + 1
  redis.call('ZREM', KEYS[4], u)
  local last = tonumber(redis.call('HGET', KEYS[5], u))
  if last and last >= now - tonumber(ARGV[4]) and redis.call('HEXISTS', KEYS[6], u) == 0 then
    local lapses = now + tonumber(ARGV[5])
    redis.call('ZADD', KEYS[3], lapses, u)
    redis.call('PEXPIREAT', KEYS[3], keep_until)
    free = free - 1
    if u == user then
      mine = lapses
    end
  end
end
return { result, position, plain, buckets, now, begins, ends, rate, opens_s, mine or 0, held }
