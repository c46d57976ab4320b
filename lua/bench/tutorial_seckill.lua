-- Baseline: the admission script of the widely copied Redis "seckill" tutorial, written
-- by us from its described behaviour, for benchmarks only (never used by the product).
--
-- The caller first takes an order id with one INCR on a per-day key
-- (`icr:order:yyyy:MM:dd`, id = (seconds since 2022-01-01) << 32 | count), then runs
-- this script with EVALSHA and no KEYS:
--
-- ARGV[1] voucher id, ARGV[2] user id, ARGV[3] order id,
-- ARGV[4] key prefix (ours, so that benchmark runs do not share keys; '' in the tutorial)
--
-- Returns 0 admitted, 1 sold out, 2 already bought.
--
-- As in the tutorial, the keys are built inside Lua from ARGV and every order goes to one
-- global stream. That is not cluster-safe: the three keys hash to three different slots.
-- Redis 7 still runs it on a cluster node that owns all of those slots (a script without
-- a shebang is allowed cross-slot access for backward compatibility), which is the case
-- of the local stack's single-node cluster; on a cluster with several shards (ElastiCache
-- Serverless) it fails with "Script attempted to access a non local key".

local voucherId = ARGV[1]
local userId = ARGV[2]
local orderId = ARGV[3]
local prefix = ARGV[4]

local stockKey = prefix .. 'seckill:stock:' .. voucherId
local orderKey = prefix .. 'seckill:order:' .. voucherId

if tonumber(redis.call('get', stockKey)) <= 0 then
  return 1
end
if redis.call('sismember', orderKey, userId) == 1 then
  return 2
end
redis.call('incrby', stockKey, -1)
redis.call('sadd', orderKey, userId)
redis.call('xadd', prefix .. 'stream.orders', '*', 'userId', userId, 'voucherId', voucherId, 'id', orderId)
return 0
