-- Probe: what one voucher's orders stream needs from the drainer, in one round trip.
--
-- KEYS[1] orders stream seckill:{<voucher>}:orders
-- KEYS[2] sale hash     seckill:{<voucher>}:sale
-- KEYS[3] deadlines     seckill:{<voucher>}:deadlines
-- KEYS[4] to settle     seckill:{<voucher>}:to_settle
-- KEYS[5] closed orders seckill:{<voucher>}:closed
-- ARGV[1] consumer group, ARGV[2] min idle (ms) before a pending entry may be claimed,
-- ARGV[3] the caller's consumer name, ARGV[4] the most spent consumers to delete,
-- ARGV[5] '1' to delete the caller's own consumer too when it holds nothing (its run
-- is ending), ARGV[6] the most new entries to read for ARGV[3] when some wait (0 or
-- absent: none)
--
-- Returns {length, pending, undelivered, fully_delivered, claimable, oldest_idle_ms,
--          ends_ms, reaped, closing, entries, own}:
--   undelivered     entries not yet delivered to the group: the count read when a read
--                   took them all (nothing pending, fewer entries than ARGV[6]), else
--                   the XINFO lag; when Redis cannot tell, 0 if the newest entry was
--                   delivered, else length - pending
--   fully_delivered 1 when the group was delivered the newest entry (or none exist)
--   claimable       1 when some pending entry has been idle for at least ARGV[2]
--   oldest_idle_ms  idle time of the oldest pending entry, -1 when none is pending
--   ends_ms         the sale's end (unix ms), -1 when Redis has no sale hash
--   reaped          spent consumers deleted
--   closing         1 when an order's payment deadline has passed (by the server's
--                   clock) or a close waits to be settled in the database (vouchers
--                   with a payment step; lua/close.lua)
--   entries         the new entries read (XREADGROUP '>' as ARGV[3], up to ARGV[6]),
--                   after every figure above was taken, unless claimable or own is 1;
--                   an empty list when none were read. They are pending for ARGV[3]
--                   now, as after any read: the survey of a run with thousands of small
--                   sales reads each one's orders in this same call, not a second one.
--   own             1 when entries are pending for ARGV[3] itself: a read whose reply
--                   was lost (this probe's own, sent again by the client after a cut
--                   connection, or an earlier run's of the same consumer) left them
--                   there, unseen. Nothing new is read then: the caller drains them
--                   first (they are older than anything undelivered), or a newer order
--                   could take the database's last unit from an earlier one.
--
-- Consumer hygiene rides along (the drainer asks for it on its last look at a stream,
-- ARGV[4] > 0; its survey passes 0): up to ARGV[4] other consumers that hold no pending entry
-- and were idle for the claim threshold (killed or retired drainers) are deleted, so the
-- group's consumer list never grows without bound, in small steps on a slot that also
-- serves admissions. XGROUP DELCONSUMER drops a consumer's pending entries with it, so a
-- consumer with any pending entry is never deleted, and the check and the delete happen
-- in this one script.
--
-- The drainer probes every active voucher with this one script instead of ~7 commands,
-- and only reads, claims or trims where the probe found work. It also makes the stream
-- and the drain group when missing (MKSTREAM, from id 0 so nothing admitted before is
-- skipped), so no other call is needed before a read. Every key shares the {<voucher>} tag.
-- Loaded after lua/lib/streams.lua (id_less, stream_group).
--
-- Redis 6.2 or later (XGROUP CREATECONSUMER, XPENDING IDLE).

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- Sale hash fields:
local ENDS_MS = 'ends_ms'
local PAY_MS = 'pay_ms'
local SENTINELS = 'sentinels'
-- The sentinel member of the deadlines, closed and to-settle keys (lua/preload.lua):
local SENTINEL = '~'

local group = ARGV[1]
local sale = redis.call('HMGET', KEYS[2], ENDS_MS, PAY_MS, SENTINELS)
local ends = tonumber(sale[1] or '-1') or -1
-- Only a sale with a payment step has deadlines and closes (lua/admit.lua, close.lua);
-- one without a sale hash is checked as if it had.
local pays = ends < 0 or sale[2] ~= false

local read = tonumber(ARGV[6]) or 0
local most = tonumber(ARGV[4]) or 0

-- The common case, cheaply: a survey's probe (asked to read, not to reap) of a stream
-- with nothing pending and fewer entries than it may read. Then nothing can be claimed,
-- and the read itself tells what waited: every entry past the group's last-delivered
-- id (at most the stream's length, so all of them), hence no XINFO and no look at the
-- newest entry (about a fifth of the probe's server time for a small sale).
-- XPENDING fails when the stream or the group is missing: the full look below makes them.
local fast = false
local length
if read > 0 and most == 0 then
  local oldest = redis.pcall('XPENDING', KEYS[1], group, '-', '+', 1)
  if type(oldest) == 'table' and oldest.err == nil and #oldest == 0 then
    length = redis.call('XLEN', KEYS[1])
    fast = length < read
  end
end

local pending, undelivered, fully, claimable, oldest_idle, own = 0, 0, 1, 0, -1, 0
if not fast then
  local info = stream_group(KEYS[1], group)
  if info == nil then
    redis.call('XGROUP', 'CREATE', KEYS[1], group, '0', 'MKSTREAM')
    info = stream_group(KEYS[1], group)
  end

  length = redis.call('XLEN', KEYS[1])
  pending = tonumber(info['pending']) or 0
  local last_delivered = info['last-delivered-id'] or '0-0'
  -- Whether the newest entry was delivered comes from the stream itself, never from the
  -- lag: after a deletion Redis may report a lag that stays above zero once everything
  -- was read (small_sales::the_probe_tells_what_waits_whether_or_not_redis_knows_the_lag):
  -- a sale that never looked fully delivered would never retire, and one reporting such
  -- a lag would be read again by every survey and show a lag on the dashboards forever.
  local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  if #newest > 0 and id_less(last_delivered, newest[1][1]) then fully = 0 end
  if fully == 1 then
    undelivered = 0
  elseif type(info['lag']) == 'number' then
    undelivered = info['lag']
  else
    -- Pending entries deleted from the stream (XDEL) can make this negative.
    undelivered = math.max(0, length - pending)
  end

  if pending > 0 then
    local oldest = redis.call('XPENDING', KEYS[1], group, '-', '+', 1)
    if #oldest > 0 then oldest_idle = oldest[1][3] end
    local idle = redis.call('XPENDING', KEYS[1], group, 'IDLE', ARGV[2], '-', '+', 1)
    if #idle > 0 then claimable = 1 end
    if #redis.call('XPENDING', KEYS[1], group, '-', '+', 1, ARGV[3]) > 0 then own = 1 end
  end
end

local reaped = 0
if most > 0 then
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], group)) do
    if reaped >= most then break end
    local t = {}
    for i = 1, #c, 2 do t[c[i]] = c[i + 1] end
    local own = t['name'] == ARGV[3]
    if tonumber(t['pending']) == 0
      and ((own and ARGV[5] == '1') or (not own and tonumber(t['idle']) >= tonumber(ARGV[2]))) then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], group, t['name'])
      reaped = reaped + 1
    end
  end
end

-- A sale preloaded before these keys existed gets their sentinels here (see
-- lua/preload.lua: the scripts name the keys), once: its sale hash then says so.
if ends >= 0 and sale[3] == false then
  redis.call('ZADD', KEYS[3], 'NX', '+inf', SENTINEL)
  redis.call('SADD', KEYS[4], SENTINEL)
  redis.call('HSETNX', KEYS[5], SENTINEL, SENTINEL)
  redis.call('HSET', KEYS[2], SENTINELS, '1')
end
local closing = 0
if pays then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if redis.call('SCARD', KEYS[4]) - redis.call('SISMEMBER', KEYS[4], SENTINEL) > 0
    or redis.call('ZCOUNT', KEYS[3], '-inf', now) > 0 then
    closing = 1
  end
end

local entries = {}
-- Not when older entries wait to be claimed, nor while the caller holds entries of its
-- own: those are drained first, and the new ones read after them, by the round (a
-- recovery that fails stops the voucher before anything newer is handed out). The
-- short way (nothing pending at all) reads whatever the stream holds.
local reading
if fast then
  reading = length > 0
else
  reading = read > 0 and claimable == 0 and own == 0 and (undelivered > 0 or fully == 0)
end
if reading then
  -- XREADGROUP makes its consumer even when it hands out nothing; the full look never
  -- reads a stream with nothing new, so neither does the short way leave a consumer.
  local made = 0
  if fast then made = redis.call('XGROUP', 'CREATECONSUMER', KEYS[1], group, ARGV[3]) end
  local r = redis.call('XREADGROUP', 'GROUP', group, ARGV[3], 'COUNT', read, 'STREAMS', KEYS[1], '>')
  if r then entries = r[1][2] end
  if #entries == 0 and made == 1 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], group, ARGV[3])
  end
end
if fast then
  -- What the read took is what waited.
  undelivered = #entries
  if undelivered > 0 then fully = 0 end
end

return {length, pending, undelivered, fully, claimable, oldest_idle, ends, reaped, closing, entries, own}
