-- Shared by the stream scripts (lua/trim.lua, lua/probe.lua, lua/expire_sale.lua): Redis
-- has no script includes, so the Rust side loads this file in front of each of them
-- (`concat!` in shared/src/adapters/order_stream.rs); each script is still one unit.

-- Compares two stream ids "ms-seq" numerically without floating point: both parts are
-- decimal integers without leading zeros, so a shorter string is a smaller number.
local function id_less(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  if ams == nil or bms == nil then return a < b end
  local function lt(x, y)
    if #x ~= #y then return #x < #y end
    return x < y
  end
  if ams ~= bms then return lt(ams, bms) end
  return lt(aseq, bseq)
end

-- The XINFO GROUPS entries of a stream, each as a field -> value table ({} when the
-- stream does not exist).
local function stream_groups(stream)
  if redis.call('EXISTS', stream) == 0 then return {} end
  local out = {}
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local t = {}
    for i = 1, #g, 2 do t[g[i]] = g[i + 1] end
    out[#out + 1] = t
  end
  return out
end

-- The XINFO GROUPS fields of one group, or nil.
local function stream_group(stream, name)
  for _, t in ipairs(stream_groups(stream)) do
    if t['name'] == name then return t end
  end
  return nil
end

