-- Order-id leasing: reserve a block of sequence numbers of one UTC day for one voucher.
--
-- KEYS[1] day counter   seckill:{ids}:seq:<yyyymmdd>
-- KEYS[2] block map     seckill:{ids}:blocks:<yyyymmdd>  (block index -> voucher id)
-- ARGV[1] block size, ARGV[2] voucher id, ARGV[3] ttl seconds
--
-- Returns the highest number of the block; the block is [last - size + 1, last] and its
-- index is last / size - 1. The counter only ever grows by the (fixed) block size.

local size = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current + size > 4294967295 then
  return redis.error_reply('order id sequence exhausted for this day')
end
local last = redis.call('INCRBY', KEYS[1], size)
redis.call('HSET', KEYS[2], tostring(last / size - 1), ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return last
