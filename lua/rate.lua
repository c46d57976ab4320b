-- A caller's rate limit, shared by every function instance (GCRA: one key per caller
-- holding the theoretical arrival time, TAT, in the server's milliseconds).
--
-- KEYS[1] the caller's limit  seckill:rate:{<caller digest>}:<route class>   string: TAT ms
-- ARGV[1] ms between two requests at the steady rate (1000 / rate)
-- ARGV[2] ms of burst allowed ahead of the steady rate ((burst - 1) x ARGV[1])
--
-- Returns 1 (allowed; the TAT moves one interval on) or 0 (over the limit; nothing
-- written). The key expires when the caller is back to a full burst, so memory holds
-- only callers seen in the last burst's worth of time. The server's clock alone decides
-- (TIME): instances whose clocks disagree share one limit.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then
    tat = now
end
if tat - now > burst then
    return 0
end
local next_tat = tat + interval
redis.call('SET', KEYS[1], next_tat, 'PX', math.max(1, next_tat - now))
return 1
