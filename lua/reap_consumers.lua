-- Consumer hygiene: delete drain-group consumers that hold no pending entries.
--
-- KEYS[1] orders stream seckill:{<voucher>}:orders
-- ARGV[1] consumer group, ARGV[2] this invocation's consumer name,
-- ARGV[3] min idle (ms) before another consumer counts as gone
--
-- Returns the number of consumers deleted.
--
-- Every invocation reads under a fresh consumer name, so without this the group's
-- consumer list would grow by one per invocation. XGROUP DELCONSUMER drops the
-- consumer's pending entries with it (they would never be redelivered: lost orders), so
-- only consumers with zero pending entries go, and the check and the delete happen in one
-- script so no entry can become pending in between. Another consumer must also have been
-- idle for the claim threshold: it may be a live drainer between two reads.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then
  return 0
end
local min_idle = tonumber(ARGV[3])
local deleted = 0
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do
    info[c[i]] = c[i + 1]
  end
  if tonumber(info['pending']) == 0
    and (info['name'] == ARGV[2] or tonumber(info['idle']) >= min_idle) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    deleted = deleted + 1
  end
end
return deleted
