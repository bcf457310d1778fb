-- Settle a pending item as rejected, keeping it with its reason (the first settlement wins).
-- KEYS: inbox, rejected (id -> reason), rejected items (id -> appended_at TAB json).
-- ARGV: stream id, item id, reason. Returns 1 if it was pending.
local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 0 then return 0 end
local fields, at, body = e[1][2], '', ''
for i = 1, #fields, 2 do
  if fields[i] == 'a' then at = fields[i + 1] elseif fields[i] == 'j' then body = fields[i + 1] end
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], at .. '\t' .. body)
redis.call('XDEL', KEYS[1], ARGV[1])
return 1
