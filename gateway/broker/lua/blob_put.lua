-- Hold one blob of a session. KEYS: index (id -> "size:keep_until"), data (id -> base64 bytes),
-- names (a channel's key -> id). ARGV: id, base64 data, size, now, keep_until, the session's
-- byte limit, key ('' for none), the keys' expiry in ms (server time: a session that stops
-- putting leaves nothing behind). Blobs past their retention go first (D222).
-- Returns {'ok', keep_until} or {'full', bytes held}.
local index, data, names = KEYS[1], KEYS[2], KEYS[3]
local id, now = ARGV[1], tonumber(ARGV[4])
local entries = redis.call('HGETALL', index)
local held, gone = 0, {}
for i = 1, #entries, 2 do
  local size, keep = string.match(entries[i + 1], '^(%d+):(%d+)$')
  if tonumber(keep) <= now then
    gone[entries[i]] = true
    redis.call('HDEL', index, entries[i])
    redis.call('HDEL', data, entries[i])
  elseif entries[i] ~= id then
    held = held + tonumber(size)
  end
end
if next(gone) ~= nil then
  local named = redis.call('HGETALL', names)
  for i = 1, #named, 2 do
    if gone[named[i + 1]] then redis.call('HDEL', names, named[i]) end
  end
end
if redis.call('HEXISTS', index, id) == 0 then
  if held + tonumber(ARGV[3]) > tonumber(ARGV[6]) then return {'full', tostring(held)} end
  redis.call('HSET', data, id, ARGV[2])
end
redis.call('HSET', index, id, ARGV[3] .. ':' .. ARGV[5])
if ARGV[7] ~= '' then redis.call('HSET', names, ARGV[7], id) end
for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ARGV[8]) end
return {'ok', ARGV[5]}
