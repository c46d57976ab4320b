-- Grace: a payment in progress holds its unit (vouchers with a payment step, a provider
-- that takes the money at its end: Stripe). Run by the buyer's checkout once the
-- provider's payment exists: the order's expiry moves `grace` ms past its deadline,
-- once, so the provider's success delivered after the deadline still pays it
-- (lua/close.lua decides every close by that expiry, as before). The deadline the buyer
-- was given stays what the order shows and what its close records.
--
-- KEYS[1] deadlines    seckill:{<voucher>}:deadlines
-- KEYS[2] closed hash  seckill:{<voucher>}:closed
-- KEYS[3] grace hash   seckill:{<voucher>}:grace (order id -> the deadline it was given)
-- ARGV[1] order id, ARGV[2] user id, ARGV[3] grace (ms, > 0)
--
-- Returns {expiry ms, deadline ms} (as strings): the order's expiry now, and the deadline
-- it was given (equal when it has no grace: asked at or after its deadline, the order
-- expires as always); nil when the user holds no open order of that id here (closed, or
-- not known). Every key shares the {<voucher>} tag. Checks first, writes last.

local order, user, grace = ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('HEXISTS', KEYS[2], order) == 1 then
  return nil
end
local member = order .. '\n' .. user
local score = redis.call('ZSCORE', KEYS[1], member)
if not score then
  return nil
end
local expiry = string.format('%.0f', tonumber(score))
local given = redis.call('HGET', KEYS[3], order)
if given then
  -- Given once already: the expiry stands.
  return {expiry, given}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not grace or grace <= 0 or now >= tonumber(score) then
  return {expiry, expiry}
end
redis.call('HSET', KEYS[3], order, expiry)
local extended = string.format('%.0f', tonumber(score) + grace)
redis.call('ZADD', KEYS[1], 'XX', extended, member)
return {extended, expiry}
