-- Replay: put one dead letter back on its voucher's orders stream, exactly once.
--
-- KEYS[1] orders stream seckill:{<voucher>}:orders
-- KEYS[2] dead letters  seckill:{<voucher>}:dead
-- KEYS[3] closed hash   seckill:{<voucher>}:closed
-- KEYS[4] to settle     seckill:{<voucher>}:to_settle
-- ARGV[1] consumer group, ARGV[2] the dead letter's id,
-- ARGV[3] the close the dead letter carries (`<state>\n<deadline>\n<ref>\n<user>`, as
-- lua/close.lua wrote it; '' when none) and ARGV[4] its order id ('' when none),
-- ARGV[5..] the order's field/value pairs as admitted (order_id, user_id; and
-- admitted_ms, which the caller adds from the original entry's id when it lacks one)
--
-- Returns the new orders-stream id, or '' when the dead letter is gone (replayed or
-- removed already): nothing is written then.
--
-- The check, the XADD and the XDEL are one script on one slot (every key shares the
-- {<voucher>} tag), so two replays of one dead letter, however they interleave, add one
-- entry. The drainer then writes it like any admission: it finds an order whose id is
-- already in the database a duplicate (nothing written twice), and an order that fails
-- again goes back to the dead letters with its new reason. The group is made if missing
-- (from 0, as lua/probe.lua does), and the stream loses any expiry a retired sale gave
-- it, so the entry cannot vanish before it is drained. Loaded after lua/lib/streams.lua
-- (stream_group).
--
-- An order closed before it was dead-lettered (paid, cancelled or expired: Redis decides
-- each close once) gets its close back, unless Redis still holds one for it (HSETNX: the
-- one decision stands), and waits among the closes to settle as every close does until
-- its row is written: so the drainer writes it as it was closed (a paid order `paid` by
-- the payment that paid it), also when the sale's keys expired or Redis lost them since.
-- Both keys lose any expiry too, like the stream.
if #redis.call('XRANGE', KEYS[2], ARGV[2], ARGV[2]) == 0 then
  return ''
end
local fields = {}
for i = 5, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
if stream_group(KEYS[1], ARGV[1]) == nil then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0')
end
redis.call('PERSIST', KEYS[1])
if ARGV[3] ~= '' and ARGV[4] ~= '' then
  redis.call('HSETNX', KEYS[3], ARGV[4], ARGV[3])
  redis.call('SADD', KEYS[4], ARGV[4])
  redis.call('PERSIST', KEYS[3])
  redis.call('PERSIST', KEYS[4])
end
redis.call('XDEL', KEYS[2], ARGV[2])
return id
