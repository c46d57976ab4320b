-- Give: the first half of moving units between two stock buckets of one voucher
-- (docs/design.md "Stock buckets"). Runs on the donor bucket.
--
-- KEYS[1] sale hash  seckill:{<voucher>}:sale       (of the donor bucket)
-- KEYS[2] transfers  seckill:{<voucher>}:transfers  (of the donor bucket)
-- ARGV[1] transfer id (unique: the order id of the attempt that asked)
-- ARGV[2] the recipient bucket (`<voucher>` or `<voucher>.<b>`)
--
-- Takes half of the donor's stock (rounded up: a last unit moves too) and records the
-- transfer (`<recipient> <units> <server ms>`) in the same script, so units that leave
-- a donor are always written down until the recipient has them: lua/take.lua adds them
-- there at most once, then the caller deletes the record. A caller that dies between
-- the two leaves the record, and the drainer's survey finishes it. Units are never made,
-- only moved, and a bucket never goes below 0.
--
-- Returns {given, open}: the units moved now (0 when the donor has none, or -1 when its
-- sale is not loaded), and how many transfers of this donor were still open before this
-- one (units on their way somewhere: a caller must not call the voucher sold out then).
--
-- Safe to run twice with one transfer id (the client sends a script again when the
-- connection dropped after it ran): a transfer already recorded is answered with its
-- units, never given again. (A record is deleted only after its units arrived, by the
-- caller that gave them, after this call returned.)

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
local NOT_LOADED = -1
local STOCK = 'stock'
-- The sentinel member keeping the transfers hash in existence (see lua/preload.lua).
local SENTINEL = '~'

local open = redis.call('HLEN', KEYS[2]) - redis.call('HEXISTS', KEYS[2], SENTINEL)
local recorded = redis.call('HGET', KEYS[2], ARGV[1])
if recorded then
  -- Given before, maybe by a copy on another connection: written again (the same
  -- value), so that a durable caller's WAIT on this connection covers the record.
  redis.call('HSET', KEYS[2], ARGV[1], recorded)
  return {tonumber(string.match(recorded, ' (%d+) ')), open - 1}
end
local stock = tonumber(redis.call('HGET', KEYS[1], STOCK))
if stock == nil then
  return {NOT_LOADED, open}
end
if stock <= 0 then
  return {0, open}
end
local n = math.ceil(stock / 2)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HINCRBY', KEYS[1], STOCK, -n)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. ' ' .. n .. ' ' .. now)
return {n, open}
