-- The waiting room: join it, or look up one's place in it (docs/design.md, "Floods and
-- bots"). One call per request, on the voucher's slot; nothing scans the queue.
--
-- KEYS[1] sale hash  seckill:{<voucher>}:sale   (bucket 0's: window, room, stock)
-- KEYS[2] queue hash seckill:{<voucher>}:queue  user id -> position (1, 2, 3, ...)
-- ARGV[1] the user id
-- ARGV[2] '1' to join (a position is given at the first join and kept ever after),
--         '0' to look only
-- ARGV[3] how long the queue is kept after the sale's end, in ms
--
-- A position is HLEN + 1 at the first join: fields are never removed, so positions are
-- exactly 1..n in the order Redis ran the joins, whoever retries how often.
--
-- Returns {result, position (0 when none), bucket 0's stock, buckets, now ms, begins ms,
-- ends ms, entry rate per s, opens before s}; only {result} for NOT_LOADED and NO_ROOM.

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- Results:
local QUEUED = 0
local NOT_LOADED = 1
local NO_ROOM = 2
local NOT_OPEN = 3
local ENDED = 4
local NOT_JOINED = 5
-- Sale hash fields:
local STOCK = 'stock'
local BEGINS_MS = 'begins_ms'
local ENDS_MS = 'ends_ms'
local BUCKETS = 'buckets'
local ROOM_RATE = 'room_rate'
local ROOM_OPENS_S = 'room_opens_s'

local sale = redis.call('HMGET', KEYS[1], STOCK, BEGINS_MS, ENDS_MS, BUCKETS, ROOM_RATE,
  ROOM_OPENS_S)
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

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local result = QUEUED
local position = tonumber(redis.call('HGET', KEYS[2], ARGV[1]))
if not position then
  if ARGV[2] ~= '1' then
    result = NOT_JOINED
  elseif now < begins - opens_s * 1000 then
    result = NOT_OPEN
  elseif now >= ends then
    result = ENDED
  else
    position = redis.call('HLEN', KEYS[2]) + 1
    redis.call('HSET', KEYS[2], ARGV[1], position)
    if position == 1 then
      redis.call('PEXPIREAT', KEYS[2], ends + tonumber(ARGV[3]))
    end
  end
end
return { result, position or 0, stock, buckets, now, begins, ends, rate, opens_s }
