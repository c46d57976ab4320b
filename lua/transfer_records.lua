-- Transfer records with the clock that stamped them: a donor bucket's open transfer
-- records (written by lua/give.lua with this server's TIME) and this server's time now,
-- so that a reader judges a record's age by the clock that stamped it (the drainer's
-- own clock may be seconds off the server's). Reads only.
--
-- KEYS[1] transfers  seckill:{<voucher>}:transfers (of the donor bucket)
--
-- Returns {now_ms, {field1, value1, field2, value2, ...}}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('HGETALL', KEYS[1])}
