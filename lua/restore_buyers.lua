-- Restore buyers: part of a repair after Redis lost a voucher's sale. Records buyers
-- that the buyers hash lost, never overwriting one it still has (HSETNX), so it is safe
-- to run while the sale is live and as often as wanted.
--
-- KEYS[1] buyers hash   seckill:{<voucher>}:buyers
-- KEYS[2] orders stream seckill:{<voucher>}:orders
-- KEYS[3] closed hash   seckill:{<voucher>}:closed (vouchers with a payment step)
-- KEYS[4] rebuys hash   seckill:{<voucher>}:rebuys (lua/close.lua)
-- ARGV[1] PAIRS: ARGV[2] the rebuy limit (below), ARGV[3..] are user id, order id, user
--         id, order id, ... (orders the database holds). Returns {'', added, returned}:
--         returned counts the orders skipped as closed with their unit given back (the
--         database still counts their unit taken until the drainer settles the close).
-- ARGV[1] STREAM: ARGV[2] the rebuy limit, ARGV[3] the start of an XRANGE page ('-', or
--         '(<id>' exclusive), ARGV[4] its COUNT. Records the buyer of every admitted
--         order still in the stream (undrained, or drained and not yet trimmed).
--         Returns {last id of the page or '' when the page was empty, added}.
--
-- A rebuy limit N > 0: the voucher lets a buyer buy again after a close, N times (its
-- `rebuy_after_close` and `rebuy_limit`, passed in: the sale hash may be what was lost).
-- Then an order Redis closed with its unit given back (cancelled or expired) names no
-- buyer, unless the buyer closed more than N (KEYS[4]; lua/close.lua kept them then): its close dropped the buyer on
-- purpose, and restoring it would refuse them for good (or hide the order they hold
-- now behind the closed one, the stream's older entry). Checked here, in the same
-- script as the write, so a close made while a repair or reconcile runs is seen. 0:
-- every order names its buyer, closed or not (a close keeps the buyer then).

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- Modes (ARGV[1]):
local PAIRS = 'pairs'
local STREAM = 'stream'
-- Orders stream entry fields:
local ORDER_ID = 'order_id'
local USER_ID = 'user_id'
-- Closed states (lua/close.lua) that gave the unit back:
local CANCELLED = 'cancelled'
local EXPIRED = 'expired'

local limit = tonumber(ARGV[2]) or 0

local function returned(order, user)
  if limit <= 0 or (tonumber(redis.call('HGET', KEYS[4], user)) or 0) > limit then
    return false
  end
  local closed = redis.call('HGET', KEYS[3], order)
  if not closed then
    return false
  end
  local state = string.match(closed, '^[^\n]*')
  return state == CANCELLED or state == EXPIRED
end

local added = 0
if ARGV[1] == PAIRS then
  local skipped = 0
  for i = 3, #ARGV - 1, 2 do
    if returned(ARGV[i + 1], ARGV[i]) then
      skipped = skipped + 1
    else
      added = added + redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
    end
  end
  return {'', added, skipped}
end
if ARGV[1] ~= STREAM then
  return redis.error_reply('restore_buyers: unknown mode ' .. tostring(ARGV[1]))
end

local entries = redis.call('XRANGE', KEYS[2], ARGV[3], '+', 'COUNT', ARGV[4])
for _, entry in ipairs(entries) do
  local fields, user, order = entry[2], nil, nil
  for i = 1, #fields - 1, 2 do
    if fields[i] == USER_ID then
      user = fields[i + 1]
    elseif fields[i] == ORDER_ID then
      order = fields[i + 1]
    end
  end
  -- A malformed entry (the drainer dead-letters it) names no buyer.
  if user and order and not returned(order, user) then
    added = added + redis.call('HSETNX', KEYS[1], user, order)
  end
end
local last = ''
if #entries > 0 then
  last = entries[#entries][1]
end
return {last, added}
