-- Restore the waiting room's queue (seckill-http's `queue`): positions the database holds
-- (each join's answer was written there first) go back into the queue hash, the
-- database's word over whatever Redis has; the last call sets the counter past every
-- position, so that joins go on after the line, never inside it.
--
-- KEYS[1] sale hash  seckill:{<voucher>}:sale  (bucket 0's)
-- KEYS[2] queue hash seckill:{<voucher>}:queue user id -> position
-- ARGV[1] how long the queue is kept after the sale's end, in ms
-- ARGV[2] '' for a page of positions; on the last call, the highest position the
--         database holds
-- ARGV[3..] user id, position, user id, position, ...
--
-- Returns 1, or 0 when the sale hash is missing (a repair must load it first: a lone
-- counter field would pass for a sale). The counter is the highest of the database's,
-- every position the queue holds (a join Redis answered whose write to the database
-- failed was told nothing but holds its place), and the counter as it is; HSETNX, so a
-- restore that finished first is kept. Reading every position costs one pass over the
-- queue, once per restore.

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- Sale hash fields:
local STOCK = 'stock'
local ENDS_MS = 'ends_ms'
local QUEUE_NEXT = 'queue_next'

local sale = redis.call('HMGET', KEYS[1], STOCK, ENDS_MS)
if not sale[1] or not tonumber(sale[2]) then
  return 0
end
for i = 3, #ARGV - 1, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
if #ARGV > 2 then
  redis.call('PEXPIREAT', KEYS[2], tonumber(sale[2]) + tonumber(ARGV[1]))
end
if ARGV[2] ~= '' then
  local top = tonumber(ARGV[2])
  for _, p in ipairs(redis.call('HVALS', KEYS[2])) do
    top = math.max(top, tonumber(p) or 0)
  end
  redis.call('HSETNX', KEYS[1], QUEUE_NEXT, top)
end
return 1
