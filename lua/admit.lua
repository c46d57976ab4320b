-- Admission: one atomic decision per purchase attempt.
--
-- KEYS[1] sale hash    seckill:{<voucher>}:sale    (stock, total, begins_ms, ends_ms)
-- KEYS[2] buyers hash  seckill:{<voucher>}:buyers  (user id -> order id)
-- KEYS[3] orders stream seckill:{<voucher>}:orders
-- ARGV[1] user id, ARGV[2] order id, ARGV[3] now (unix ms), ARGV[4] voucher id
--
-- Returns {code, detail, begins_ms, ends_ms, stock_after}:
--   0 admitted         detail = ''
--   1 not loaded       (no sale hash: never preloaded, or lost)
--   2 not started, 3 ended, 4 sold out
--   5 already bought   detail = the order id the user already holds
--
-- Every key is in KEYS and shares the {<voucher>} hash tag, so this runs unchanged on
-- Redis Cluster. A script that fails part-way keeps its earlier writes, so every check
-- comes before the first write (HSETNX: the last check and the first write). No MAXLEN
-- on XADD: trimming could drop undrained orders.

local sale = redis.call('HMGET', KEYS[1], 'stock', 'begins_ms', 'ends_ms')
local stock, begins, ends = tonumber(sale[1]), tonumber(sale[2]), tonumber(sale[3])
if stock == nil or begins == nil or ends == nil then
  return {1, '', 0, 0, 0}
end

local now = tonumber(ARGV[3])
if now < begins then
  return {2, '', begins, ends, stock}
end
if now >= ends then
  return {3, '', begins, ends, stock}
end

if stock <= 0 then
  local held = redis.call('HGET', KEYS[2], ARGV[1])
  if held then
    return {5, held, begins, ends, 0}
  end
  return {4, '', begins, ends, 0}
end

-- All sale checks passed. HSETNX is both the already-bought check and the first write:
-- one command instead of HGET then HSET on the path every admission takes.
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return {5, redis.call('HGET', KEYS[2], ARGV[1]), begins, ends, stock}
end
local left = redis.call('HINCRBY', KEYS[1], 'stock', -1)
redis.call('XADD', KEYS[3], '*',
  'order_id', ARGV[2], 'voucher_id', ARGV[4], 'user_id', ARGV[1], 'admitted_ms', ARGV[3])
return {0, '', begins, ends, left}
