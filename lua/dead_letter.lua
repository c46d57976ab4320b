-- Dead-lettering: move one orders-stream entry to the voucher's dead-letter stream.
--
-- KEYS[1] orders stream  seckill:{<voucher>}:orders
-- KEYS[2] dead letters   seckill:{<voucher>}:dead
-- ARGV[1] consumer group, ARGV[2] entry id, ARGV[3] reason, ARGV[4] delivery count,
-- ARGV[5..] the entry's original field/value pairs
--
-- Returns WRITTEN when the dead letter was written and the entry acked, NOT_PENDING when
-- the entry was no longer pending (another drainer already acked or dead-lettered it: writing a second
-- dead letter would only duplicate it).
--
-- Both keys share the {<voucher>} hash tag, so the copy and the XACK happen atomically
-- on one cluster slot: an entry is never acked without its dead letter, and never
-- dead-lettered twice. The only check comes before the first write.

-- Shared with Rust (shared/src/protocol.rs; its test checks that the two agree).
-- Results:
local WRITTEN = 1
local NOT_PENDING = 0
-- Fields a dead letter adds to the entry's own:
local SOURCE_ID = 'source_id'
local REASON = 'reason'
local DELIVERIES = 'deliveries'

local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 then
  return NOT_PENDING
end

local fields = {}
for i = 5, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
fields[#fields + 1] = SOURCE_ID
fields[#fields + 1] = ARGV[2]
fields[#fields + 1] = REASON
fields[#fields + 1] = ARGV[3]
fields[#fields + 1] = DELIVERIES
fields[#fields + 1] = ARGV[4]

redis.call('XADD', KEYS[2], '*', unpack(fields))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return WRITTEN
