-- Shared by every script: KEYS[1] is the session's meta key; the other keys share its hash tag.
local meta = KEYS[1]
local base = string.sub(meta, 1, #meta - 4)
local function err(code, msg) return redis.error_reply('GW ' .. code .. ' ' .. msg) end
local function clock(arg)
  local now = tonumber(arg)
  if now then return now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
