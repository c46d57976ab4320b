-- Order-id leasing: stamp a block of ids for one voucher (see shared/src/order_id.rs).
--
-- KEYS[1] lease clock  seckill:{ids}:clock               hash: ms, slot, seen, skew
-- KEYS[2] block map    seckill:{ids}:blocks:<yyyymmdd>   '<ms>:<slot>' -> voucher id
-- ARGV[1] voucher id, ARGV[2] the UTC day (days since 1970) KEYS[2] is named after,
-- ARGV[3] block map ttl seconds, ARGV[4] id epoch (unix ms), ARGV[5] jump ms,
-- ARGV[6] slots per ms
--
-- Returns {ms, slot}: the block is every id with that stamp (ms since the id epoch).
-- Returns {OTHER_DAY, day} and writes nothing when the stamp falls on another UTC day than
-- KEYS[2] names (the caller's clock disagrees with the server's near midnight): call
-- again with that day's key.
--
-- The clock is a hybrid logical clock. `ms`/`slot` is the latest stamp; `seen` is the
-- server's TIME when it was issued; `skew` is what stamps add to TIME (0 unless a jump,
-- below, happened). Stamps strictly increase over every lease this server remembers. A
-- lease it has forgotten (the last second of AOF everysec, a write a promoted replica
-- never got) is still used by its instance, so a new stamp must not repeat it either:
-- stamps follow TIME + skew, and a restarted server reads a later TIME (a restart takes
-- far more than a millisecond); a server whose TIME reads earlier than `seen` (a failover
-- to a clock that is behind, or a clock stepped back) jumps ARGV[5] ms past the latest
-- stamp it knows, beyond anything the lost writes can have used, and from then on
-- follows its own clock that far ahead (skew), so that a later loss on this server is
-- again covered by its clock moving on.
--
-- Every check comes before the first write. Numbers stay below 2^53 and print exactly
-- (ms < 2^41 has 13 digits).

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- The first element of a reply that leased nothing (the second is the server's day):
local OTHER_DAY = -1

local epoch = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - epoch

local st = redis.call('HMGET', KEYS[1], 'ms', 'slot', 'seen', 'skew')
local ms, slot, seen = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
local skew = tonumber(st[4]) or 0
if ms == nil or slot == nil or seen == nil then
  ms, slot, skew = now, 0, 0
elseif now < seen then
  ms, slot = ms + tonumber(ARGV[5]), 0
  skew = ms - now
elseif now + skew > ms then
  ms, slot = now + skew, 0
else
  slot = slot + 1
  if slot >= tonumber(ARGV[6]) then
    ms, slot = ms + 1, 0
  end
end
if ms < 1 or ms >= 2199023255552 then
  return redis.error_reply('the lease clock is outside the order id epoch')
end

local day = math.floor((epoch + ms) / 86400000)
if day ~= tonumber(ARGV[2]) then
  return {OTHER_DAY, day}
end

redis.call('HSET', KEYS[1], 'ms', ms, 'slot', slot, 'seen', now, 'skew', skew)
redis.call('HSET', KEYS[2], ms .. ':' .. slot, ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return {ms, slot}
