-- Replay: put one dead letter back on its voucher's orders stream, exactly once.
--
-- KEYS[1] orders stream seckill:{<voucher>}:orders
-- KEYS[2] dead letters  seckill:{<voucher>}:dead
-- ARGV[1] consumer group, ARGV[2] the dead letter's id,
-- ARGV[3..] the order's field/value pairs as admitted (order_id, user_id; and
-- admitted_ms, which the caller adds from the original entry's id when it lacks one)
--
-- Returns the new orders-stream id, or '' when the dead letter is gone (replayed or
-- removed already): nothing is written then.
--
-- The check, the XADD and the XDEL are one script on one slot (both keys share the
-- {<voucher>} tag), so two replays of one dead letter, however they interleave, add one
-- entry. The drainer then writes it like any admission: it finds an order whose id is
-- already in the database a duplicate (nothing written twice), and an order that fails
-- again goes back to the dead letters with its new reason. The group is made if missing
-- (from 0, as lua/probe.lua does), and the stream loses any expiry a retired sale gave
-- it, so the entry cannot vanish before it is drained. Loaded after lua/lib/streams.lua
-- (stream_group).
if #redis.call('XRANGE', KEYS[2], ARGV[2], ARGV[2]) == 0 then
  return ''
end
local fields = {}
for i = 3, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
if stream_group(KEYS[1], ARGV[1]) == nil then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0')
end
redis.call('PERSIST', KEYS[1])
redis.call('XDEL', KEYS[2], ARGV[2])
return id
