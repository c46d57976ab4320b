-- Preload: make a voucher sellable in Redis. Idempotent, never overwrites.
--
-- KEYS[1] sale hash seckill:{<voucher>}:sale, KEYS[2] orders stream seckill:{<voucher>}:orders
-- ARGV[1] stock left, ARGV[2] total stock, ARGV[3] begins_ms, ARGV[4] ends_ms,
-- ARGV[5] consumer group name
--
-- Returns 1 when it created the sale, 0 when the sale was already there (its stock is
-- live and must not be reset: a repair after admissions began would oversell).

local created = 0
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'total', ARGV[2],
    'begins_ms', ARGV[3], 'ends_ms', ARGV[4])
  created = 1
end

-- The drainers' group, from the very first entry. BUSYGROUP (already there) is fine.
local ok, err = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[2], ARGV[5], '0', 'MKSTREAM')
if not ok and not string.find(tostring(err), 'BUSYGROUP', 1, true) then
  return redis.error_reply(tostring(err))
end
return created
