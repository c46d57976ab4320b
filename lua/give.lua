-- Give: the first half of moving units between two stock buckets of one voucher
-- (docs/design.md "Stock buckets"). Runs on the donor bucket.
--
-- KEYS[1] sale hash  seckill:{<voucher>}:sale       (of the donor bucket)
-- KEYS[2] transfers  seckill:{<voucher>}:transfers  (of the donor bucket)
-- KEYS[3] offers     seckill:{<voucher>}:offers     (of the donor bucket: user id scored
--                    by when their offer of a returned unit lapses, lua/queue.lua)
-- ARGV[1] transfer id (unique: the order id of the attempt that asked)
-- ARGV[2] the recipient bucket (`<voucher>` or `<voucher>.<b>`)
-- ARGV[3] the buyer the recipient borrows for ('' when none is named)
--
-- Takes half of the donor's stock (rounded up: a last unit moves too) and records the
-- transfer (`<recipient> <units> <server ms>`) in the same script, so units that leave
-- a donor are always written down until the recipient has them: lua/take.lua adds them
-- there at most once, then the caller deletes the record. A caller that dies between
-- the two leaves the record, and the drainer's survey finishes it. Units are never made,
-- only moved, and a bucket never goes below 0.
--
-- Units held for a waiting room's line (`held`, lua/close.lua) are not given to anyone
-- (all of them until `held_until`, after it those a live offer holds), except one to
-- the buyer named in ARGV[3] when they hold a live offer here: that unit moves with
-- the offer (`<recipient> 1 <server ms> offer <lapses ms> <user>`; lua/take.lua holds it
-- in the recipient for that buyer alone, who buys from their own bucket).
--
-- Returns {given, open}: the units moved now (0 when the donor has none, or -1 when its
-- sale is not loaded), and how many transfers of this donor were still open before this
-- one (units on their way somewhere: a caller must not call the voucher sold out then;
-- those going to the line or with an offer are not counted).
--
-- Safe to run twice with one transfer id (the client sends a script again when the
-- connection dropped after it ran): a transfer already recorded is answered with its
-- units, never given again. (A record is deleted only after its units arrived, by the
-- caller that gave them, after this call returned.)

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
local NOT_LOADED = -1
local STOCK = 'stock'
local HELD = 'held'
local HELD_UNTIL = 'held_until'
local OFFER = 'offer'
-- The sentinel member keeping the transfers hash in existence (see lua/preload.lua).
local SENTINEL = '~'

local open = redis.call('HLEN', KEYS[2]) - redis.call('HEXISTS', KEYS[2], SENTINEL)
if open > 0 then
  -- Units on their way to the line or with an offer are nobody else's: only borrowed
  -- stock (a record of three words) counts. Open records are few: a scan is cheap.
  open = 0
  for _, r in ipairs(redis.call('HVALS', KEYS[2])) do
    if string.match(r, '^%S+ %d+ %d+$') then
      open = open + 1
    end
  end
end
local recorded = redis.call('HGET', KEYS[2], ARGV[1])
if recorded then
  -- Given before, maybe by a copy on another connection: written again (the same
  -- value), so that a durable caller's WAIT on this connection covers the record.
  redis.call('HSET', KEYS[2], ARGV[1], recorded)
  return {tonumber(string.match(recorded, ' (%d+) ')), open - 1}
end
local sale = redis.call('HMGET', KEYS[1], STOCK, HELD, HELD_UNTIL)
local stock = tonumber(sale[1])
if stock == nil then
  return {NOT_LOADED, open}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = tonumber(sale[2]) or 0
if held > 0 and stock > 0 then
  local user = ARGV[3] or ''
  local lapses = user ~= '' and tonumber(redis.call('ZSCORE', KEYS[3], user)) or 0
  if lapses > now then
    -- The buyer's offer: one held unit goes with it to their bucket.
    redis.call('ZREM', KEYS[3], user)
    redis.call('HINCRBY', KEYS[1], STOCK, -1)
    redis.call('HSET', KEYS[1], HELD, math.min(held - 1, stock - 1))
    redis.call('HSET', KEYS[2], ARGV[1],
      ARGV[2] .. ' 1 ' .. now .. ' ' .. OFFER .. ' ' .. string.format('%.0f', lapses) .. ' ' .. user)
    return {1, open}
  end
  local reserved = held
  if now >= (tonumber(sale[3]) or 0) then
    reserved = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
  end
  stock = stock - reserved
end
if stock <= 0 then
  return {0, open}
end
local n = math.ceil(stock / 2)
local left = redis.call('HINCRBY', KEYS[1], STOCK, -n)
if held > 0 then
  redis.call('HSET', KEYS[1], HELD, math.min(held, left))
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. ' ' .. n .. ' ' .. now)
return {n, open}
