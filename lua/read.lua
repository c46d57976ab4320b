-- Read: a drainer's next new entries of one orders stream, unless it holds unseen
-- entries of its own, in one call.
--
-- KEYS[1] orders stream seckill:{<voucher>}:orders
-- ARGV[1] consumer group, ARGV[2] the caller's consumer name, ARGV[3] the most entries
-- to read, ARGV[4] the id of the last entry of the caller's batch in hand ('' when it
-- holds none)
--
-- Returns {own, entries}. own is 1 when entries are pending for ARGV[2] past ARGV[4]: a
-- read whose reply was lost left them there, unseen (an earlier copy of this very
-- call, which the client sends again after a cut connection, or an earlier read).
-- Nothing is read then: the caller takes those first, since they are older than
-- anything undelivered, and a newer order written before them could take the
-- database's last unit from an earlier one. Else own is 0 and entries are the new ones
-- read for ARGV[2] (XREADGROUP '>' COUNT ARGV[3]), pending for it now; an empty list
-- when none wait.
--
-- A plain XREADGROUP sent twice (the client does so after a cut connection) hands out
-- two batches, the first one lost until the claim threshold; this script sent twice
-- reads once. Redis 6.2 or later (XPENDING with an exclusive start).

local start = '-'
if ARGV[4] ~= '' then
  start = '(' .. ARGV[4]
end
if #redis.call('XPENDING', KEYS[1], ARGV[1], start, '+', 1, ARGV[2]) > 0 then
  return {1, {}}
end
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], '>')
if r then
  return {0, r[1][2]}
end
return {0, {}}
