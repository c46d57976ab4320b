-- Trimming: drop the orders-stream entries every consumer group is done with.
--
-- KEYS[1] orders stream seckill:{<voucher>}:orders
--
-- Returns {removed, minid}: the number of entries XTRIM removed and the MINID it used
-- ('' and 0 when it did not trim).
--
-- An entry may go only when, for every group, it is acked (older than the group's oldest
-- pending entry) and delivered (not newer than the group's last-delivered id). MINID
-- keeps entries >= its id, so MINID = min over groups of min(oldest pending,
-- last-delivered) removes exactly entries strictly below both bounds. A stream without
-- groups is never trimmed (nothing says its entries were delivered). Reading the bounds
-- and trimming in one script means no delivery or claim can slip in between.
-- (XADD/XTRIM MAXLEN would ignore the groups and could drop undrained orders.)
-- Loaded after lua/lib/streams.lua (id_less, stream_groups).

local groups = stream_groups(KEYS[1])
if #groups == 0 then
  return {0, ''}
end

local minid = nil
for _, info in ipairs(groups) do
  local bound = info['last-delivered-id']
  if tonumber(info['pending']) > 0 then
    local summary = redis.call('XPENDING', KEYS[1], info['name'])
    local oldest = summary[2]
    if oldest and id_less(oldest, bound) then
      bound = oldest
    end
  end
  if minid == nil or id_less(bound, minid) then
    minid = bound
  end
end

if minid == nil or minid == '0-0' then
  return {0, ''}
end
local removed = redis.call('XTRIM', KEYS[1], 'MINID', minid)
return {removed, minid}
