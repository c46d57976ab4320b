-- Close: the one decision of an order's end after admission (vouchers with a payment
-- step only). Paid, cancelled or expired, decided once: whoever closes the order first
-- wins, and every later call is told that outcome.
--
-- KEYS[1] sale hash    seckill:{<voucher>}:sale
-- KEYS[2] buyers hash  seckill:{<voucher>}:buyers
-- KEYS[3] deadlines    seckill:{<voucher>}:deadlines
-- KEYS[4] closed hash  seckill:{<voucher>}:closed
-- KEYS[5] to settle    seckill:{<voucher>}:to_settle
-- KEYS[6] grace hash   seckill:{<voucher>}:grace (lua/grace.lua: an order whose expiry
--                      was moved past its deadline, and that deadline)
-- KEYS[7] rebuys hash  seckill:{<voucher>}:rebuys (user id -> their orders closed unpaid)
-- KEYS[8] transfers    seckill:{<voucher>}:transfers (lua/give.lua: units on their way
--                      to another bucket)
-- ARGV[1] action:
--   PAY        ARGV[2] order id, ARGV[3] user id, ARGV[4] payment reference
--   CANCEL     ARGV[2] order id, ARGV[3] user id
--   EXPIRE_DUE ARGV[2] the most orders to expire in this call
--
-- PAY and CANCEL return the order's closed value `<state>\n<deadline ms>\n<ref>\n<user>`
-- (state PAID, CANCELLED or EXPIRED), whether this call closed it or an earlier one did
-- (the caller compares: a repeat of the same payment gets the same answer), or nil
-- when the user holds no open order of that id here. A payment at or after the order's
-- expiry (its score in the deadlines: the deadline, or past it by a grace given at
-- checkout, lua/grace.lua) expires the order instead (the server's clock, as for
-- admission). The closed value records the deadline the buyer was given.
-- EXPIRE_DUE closes up to ARGV[2] orders whose deadline has passed and returns
-- {expired now, orders still to settle}.
--
-- The unit of a cancelled or expired order goes back to the sale's stock here, once:
-- only the call that writes the closed value returns it. The order joins `to_settle`
-- until the drainer records its close in the database (and, for a return, gives the
-- database its unit back). With `rebuy` = N > 0 in the sale hash (the voucher's rebuy
-- limit), the buyer's record is dropped too, so they may buy again, for the first N such
-- closes of theirs (counted in KEYS[7]); after that they keep their last order for good,
-- so one account cannot cancel and rebuy in a loop. A sale with a waiting room holds the
-- unit for its line in bucket 0, where the line is (`held`, until HOLD_MS from now:
-- `held_until`; lua/queue.lua offers it to the earliest waiting position still looking,
-- lua/admit.lua sells it only to that offer's holder, lua/give.lua gives it only with
-- the offer to the holder's own bucket). A unit returned in another bucket of such a
-- sale goes to bucket 0 as a transfer (`line:<order id>` in KEYS[8], `<voucher> 1 <server
-- ms> line`, written here in place of the stock: lua/take.lua holds it there; the
-- closer delivers it at once, the drainer's survey if the closer died). Every key
-- shares the {<voucher>} tag. Checks first, writes last.

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- Actions:
local PAY = 'pay'
local CANCEL = 'cancel'
local EXPIRE_DUE = 'expire_due'
-- Closed states:
local PAID = 'paid'
local CANCELLED = 'cancelled'
local EXPIRED = 'expired'
-- Sale hash fields:
local STOCK = 'stock'
local REBUY = 'rebuy'
local ROOM_RATE = 'room_rate'
local HELD = 'held'
local HELD_UNTIL = 'held_until'
-- The fourth word of a transfer record holding a returned unit for the line:
local LINE = 'line'
-- How long a returned unit waits for the line before anyone may take it, in ms:
-- twice the longest a waiter is told to wait before looking again.
local HOLD_MS = 60000
-- The sentinel member of the deadlines, closed and to-settle keys (lua/preload.lua):
local SENTINEL = '~'

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function close(order, user, expiry, state, ref)
  local deadline = redis.call('HGET', KEYS[6], order) or expiry
  local value = state .. '\n' .. deadline .. '\n' .. ref .. '\n' .. user
  redis.call('HSET', KEYS[4], order, value)
  redis.call('ZREM', KEYS[3], order .. '\n' .. user)
  redis.call('HDEL', KEYS[6], order)
  -- A sale hash Redis lost is not recreated here with a stock field alone (the
  -- admission would take it for a live sale without a window): the repair rebuilds it
  -- from the database, which gets this unit back when the close is settled.
  if state ~= PAID and redis.call('EXISTS', KEYS[1]) == 1 then
    local room = redis.call('HGET', KEYS[1], ROOM_RATE)
    -- Bucket 0's keys carry the bare voucher id as their tag (shared/src/keys.rs).
    local home = string.match(KEYS[1], '^[^{]*{(%d+)}')
    if room and not home then
      local voucher = string.match(KEYS[1], '^[^{]*{(%d+)%.')
      redis.call('HSET', KEYS[8], 'line:' .. order, voucher .. ' 1 ' .. now .. ' ' .. LINE)
    else
      redis.call('HINCRBY', KEYS[1], STOCK, 1)
      if room then
        redis.call('HINCRBY', KEYS[1], HELD, 1)
        redis.call('HSET', KEYS[1], HELD_UNTIL, now + HOLD_MS)
      end
    end
    local limit = tonumber(redis.call('HGET', KEYS[1], REBUY)) or 0
    if limit > 0 and redis.call('HGET', KEYS[2], user) == order
        and redis.call('HINCRBY', KEYS[7], user, 1) <= limit then
      redis.call('HDEL', KEYS[2], user)
    end
  end
  redis.call('SADD', KEYS[5], order)
  return value
end

if ARGV[1] == EXPIRE_DUE then
  local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
  local expired = 0
  for i = 1, #due, 2 do
    local member = due[i]
    local sep = string.find(member, '\n', 1, true)
    local order, user = string.sub(member, 1, sep - 1), string.sub(member, sep + 1)
    if redis.call('HEXISTS', KEYS[4], order) == 0 then
      close(order, user, string.format('%.0f', tonumber(due[i + 1])), EXPIRED, '')
      expired = expired + 1
    else
      redis.call('ZREM', KEYS[3], member)
    end
  end
  local waiting = redis.call('SCARD', KEYS[5]) - redis.call('SISMEMBER', KEYS[5], SENTINEL)
  return {expired, waiting}
end

if ARGV[1] ~= PAY and ARGV[1] ~= CANCEL then
  return redis.error_reply('close: unknown action ' .. tostring(ARGV[1]))
end
local order, user = ARGV[2], ARGV[3]
local prior = redis.call('HGET', KEYS[4], order)
if prior then
  -- Closed before, maybe by a copy on another connection: written again (the same
  -- value), so that a durable caller's WAIT on this connection covers the close.
  redis.call('HSET', KEYS[4], order, prior)
  return prior
end
local expiry = redis.call('ZSCORE', KEYS[3], order .. '\n' .. user)
if not expiry then
  return nil
end
expiry = string.format('%.0f', tonumber(expiry))
if now >= tonumber(expiry) then
  return close(order, user, expiry, EXPIRED, '')
end
if ARGV[1] == PAY then
  return close(order, user, expiry, PAID, ARGV[4])
end
return close(order, user, expiry, CANCELLED, '')
