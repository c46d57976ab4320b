-- Admission: one atomic decision per purchase attempt.
--
-- KEYS[1] sale hash    seckill:{<voucher>}:sale    (stock, total, begins_ms, ends_ms)
-- KEYS[2] buyers hash  seckill:{<voucher>}:buyers  (user id -> order id)
-- KEYS[3] orders stream seckill:{<voucher>}:orders
-- ARGV[1] user id, ARGV[2] order id, ARGV[3] voucher id
--
-- The clock is the Redis server's (TIME), not the caller's: every instance sees the
-- same window whatever its own clock says. Redis >= 5 replicates a script's effects,
-- not the script, so a non-deterministic TIME is allowed before writes.
--
-- Returns {code, detail, begins_ms, ends_ms, stock_after, now_ms}:
--   0 admitted         detail = ''
--   1 not loaded       (no sale hash: never preloaded, or lost)
--   2 not started, 3 ended, 4 sold out
--   5 already bought   detail = the order id the user already holds
-- now_ms is the server time the decision used (the caller learns its clock offset).
--
-- Every key is in KEYS and shares the {<voucher>} hash tag, so this runs unchanged on
-- Redis Cluster. A script that fails part-way keeps its earlier writes, so every check
-- comes before the first write (HSETNX: the last check and the first write). No MAXLEN
-- on XADD: trimming could drop undrained orders.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A Lua number is a double: pass it on as integer text, never as '1.8e+12'.
local now_text = string.format('%.0f', now)

local sale = redis.call('HMGET', KEYS[1], 'stock', 'begins_ms', 'ends_ms')
local stock, begins, ends = tonumber(sale[1]), tonumber(sale[2]), tonumber(sale[3])
if stock == nil or begins == nil or ends == nil then
  return {1, '', 0, 0, 0, now}
end

if now < begins then
  return {2, '', begins, ends, stock, now}
end
if now >= ends then
  return {3, '', begins, ends, stock, now}
end

if stock <= 0 then
  local held = redis.call('HGET', KEYS[2], ARGV[1])
  if held then
    return {5, held, begins, ends, 0, now}
  end
  return {4, '', begins, ends, 0, now}
end

-- All sale checks passed. HSETNX is both the already-bought check and the first write:
-- one command instead of HGET then HSET on the path every admission takes.
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return {5, redis.call('HGET', KEYS[2], ARGV[1]), begins, ends, stock, now}
end
local left = redis.call('HINCRBY', KEYS[1], 'stock', -1)
redis.call('XADD', KEYS[3], '*',
  'order_id', ARGV[2], 'voucher_id', ARGV[3], 'user_id', ARGV[1], 'admitted_ms', now_text)
return {0, '', begins, ends, left, now}
