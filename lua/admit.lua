-- Admission: one atomic decision per purchase attempt.
--
-- KEYS[1] sale hash    seckill:{<voucher>}:sale    (stock, total, begins_ms, ends_ms)
-- KEYS[2] buyers hash  seckill:{<voucher>}:buyers  (user id -> order id)
-- KEYS[3] orders stream seckill:{<voucher>}:orders
-- KEYS[4] deadlines    seckill:{<voucher>}:deadlines (written when the sale has pay_ms;
--                      it always exists, see lua/preload.lua)
-- KEYS[5] closed       seckill:{<voucher>}:closed (order id -> its close, lua/close.lua;
--                      read by resends only)
-- KEYS[6] offers       seckill:{<voucher>}:offers (user id scored by when their offer
--                      of a returned unit lapses, lua/queue.lua; read only while units
--                      are held)
-- ARGV[1] user id, ARGV[2] order id, ARGV[3] (optional) 'again': this call is sent
--         again after an earlier copy of the same attempt got no reply in time
--
-- The clock is the Redis server's (TIME), not the caller's: every instance sees the
-- same window whatever its own clock says. Redis >= 5 replicates a script's effects,
-- not the script, so a non-deterministic TIME is allowed before writes.
--
-- Returns, when the attempt is admitted, the bare integer stock_after (>= 0): the caller
-- already knows the order id and, having reached Redis, the window; a reply table costs
-- the server more than any single command here. Otherwise
-- {code, detail, begins_ms, ends_ms, stock, now_ms}, code one of:
--   NOT_LOADED       (no sale hash: never preloaded, or lost)
--   NOT_STARTED, ENDED, SOLD_OUT
--   ALREADY_BOUGHT   detail = the order id the user already holds
--   SUPERSEDED       a copy sent again already decided this attempt; nothing written
-- now_ms is the server time the decision used (the caller learns its clock offset).
--
-- The order's stream entry holds only order_id and user_id: its id (`<ms>-<seq>`, from
-- the same server clock) is the admission time, and the key names the voucher. Fewer,
-- smaller fields are less for the server to write and for the stream to hold.
--
-- A voucher with a payment step (`pay_ms` in its sale hash) also gets the order's
-- payment deadline: the entry id's time plus pay_ms, so the database computes the same
-- deadline from the admission time (admitted_at + pay_within_ms). The member is
-- `<order id>\n<user id>`: lua/close.lua finds an order only with its buyer's id.
--
-- Copies of one attempt (one order id): a caller that got no reply sends the call again
-- (ARGV[3] 'again'), and the first copy may still run later, after the resend was
-- answered. The resend decides: it first marks the order id in the sale hash (field
-- 'again:<order id>'), and a copy without 'again' that finds the mark writes nothing.
-- So a late first copy never admits an attempt its resend refused (sold out, then a
-- unit came back), nor admits again an order the buyer has cancelled since. Nor does
-- the resend itself when the order it carries was closed after an earlier copy admitted
-- it (the buyer learned the order id by looking it up, and cancelled): the closed hash
-- says so, since a voucher that lets buyers buy again has forgotten the buyer, and the
-- buyers hash alone would let the resend take a second unit for a closed order. A copy
-- that finds the buyer holding this very order id also marks it: that write is what a
-- durable caller's WAIT then waits for (the order's own write may have gone out on
-- another connection, which this connection's WAIT does not cover), and it voids any
-- later copy. Marks are written only on resends and such finds, never on the common
-- path, and go with the sale hash when the sale is retired.
--
-- Units held for a waiting room's line (`held`, lua/close.lua and lua/queue.lua): while
-- the sale hash has any, the caller may take one only with a live offer of theirs (then
-- the offer is used up); anyone else only the units not held: all held ones until
-- `held_until`, after it only those an offer holds. Held units never exceed the stock.
-- A sale without held units reads two more fields of its hash and nothing else.
--
-- Every key is in KEYS and shares the {<voucher>} hash tag, so this runs unchanged on
-- Redis Cluster. A script that fails part-way keeps its earlier writes, so every check
-- comes before the first write (HSETNX: the last check and the first write). No MAXLEN
-- on XADD: trimming could drop undrained orders.

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- Result codes (an admitted attempt's reply is the bare integer, see above):
local NOT_LOADED = 1
local NOT_STARTED = 2
local ENDED = 3
local SOLD_OUT = 4
local ALREADY_BOUGHT = 5
local SUPERSEDED = 6
-- Sale hash fields:
local STOCK = 'stock'
local BEGINS_MS = 'begins_ms'
local ENDS_MS = 'ends_ms'
local PAY_MS = 'pay_ms'
local HELD = 'held'
local HELD_UNTIL = 'held_until'
local AGAIN_PREFIX = 'again:'
-- ARGV[3] of a resend:
local AGAIN = 'again'
-- Orders stream entry fields:
local ORDER_ID = 'order_id'
local USER_ID = 'user_id'

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The mark of this attempt (see above) is read with the sale: no command of its own.
local mark = AGAIN_PREFIX .. ARGV[2]
local sale = redis.call('HMGET', KEYS[1], STOCK, BEGINS_MS, ENDS_MS, PAY_MS, mark, HELD,
  HELD_UNTIL)
local stock, begins, ends = tonumber(sale[1]), tonumber(sale[2]), tonumber(sale[3])
local pay = sale[4] and tonumber(sale[4])
if stock == nil or begins == nil or ends == nil or pay == nil then
  return {NOT_LOADED, '', 0, 0, 0, now}
end
local marked, again = sale[5], ARGV[3] == AGAIN

-- A resend marks the attempt (only a loaded sale: a lone field would pass for a loaded
-- sale hash). Marked already: a copy of this resend ran (the client sent it once more
-- after a dropped connection) and decided; this one only reports.
if again then
  if marked then
    local held = redis.call('HGET', KEYS[2], ARGV[1])
    if held == ARGV[2] then
      redis.call('HSET', KEYS[1], mark, 1)
      return {ALREADY_BOUGHT, held, begins, ends, stock, now}
    end
    return {SUPERSEDED, held or '', begins, ends, stock, now}
  end
  redis.call('HSET', KEYS[1], mark, 1)
  if redis.call('HEXISTS', KEYS[5], ARGV[2]) == 1 then
    local held = redis.call('HGET', KEYS[2], ARGV[1])
    return {SUPERSEDED, held or '', begins, ends, stock, now}
  end
end

if now < begins then
  return {NOT_STARTED, '', begins, ends, stock, now}
end
if now >= ends then
  return {ENDED, '', begins, ends, stock, now}
end

-- Units held for the line: this caller's offer takes one, else only the rest count.
local held_units = tonumber(sale[6]) or 0
local offered = false
if held_units > 0 and stock > 0 then
  offered = (tonumber(redis.call('ZSCORE', KEYS[6], ARGV[1])) or 0) > now
  if not offered then
    local reserved = held_units
    if now >= (tonumber(sale[7]) or 0) then
      reserved = redis.call('ZCOUNT', KEYS[6], '(' .. now, '+inf')
    end
    stock = stock - reserved
  end
end

if stock <= 0 then
  local held = redis.call('HGET', KEYS[2], ARGV[1])
  if held then
    -- This attempt's own order (a copy of it ran): marked, see above.
    if held == ARGV[2] then
      redis.call('HSET', KEYS[1], mark, 1)
    end
    return {ALREADY_BOUGHT, held, begins, ends, 0, now}
  end
  return {SOLD_OUT, '', begins, ends, 0, now}
end

-- A late copy of an attempt its resend decided: nothing to write.
if marked and not again then
  local held = redis.call('HGET', KEYS[2], ARGV[1])
  return {SUPERSEDED, held or '', begins, ends, stock, now}
end

-- All sale checks passed. HSETNX is both the already-bought check and the first write:
-- one command instead of HGET then HSET on the path every admission takes.
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  local held = redis.call('HGET', KEYS[2], ARGV[1])
  if held == ARGV[2] then
    redis.call('HSET', KEYS[1], mark, 1)
  end
  return {ALREADY_BOUGHT, held, begins, ends, stock, now}
end
local left = redis.call('HINCRBY', KEYS[1], STOCK, -1)
if held_units > 0 then
  if offered then
    held_units = held_units - 1
    redis.call('ZREM', KEYS[6], ARGV[1])
  end
  redis.call('HSET', KEYS[1], HELD, math.min(held_units, left))
end
local id = redis.call('XADD', KEYS[3], '*', ORDER_ID, ARGV[2], USER_ID, ARGV[1])
if pay then
  local admitted = tonumber(string.match(id, '^%d+'))
  redis.call('ZADD', KEYS[4], admitted + pay, ARGV[2] .. '\n' .. ARGV[1])
end
return left
