-- Every lane's replied-through mark of one session to one seq, lower or higher (its store
-- history was replaced). KEYS: threads. ARGV: seq. Returns how many lanes there are.
local lanes = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, 2) == 't:' then
    redis.call('HSET', KEYS[1], 'r:' .. string.sub(field, 3), ARGV[1])
    lanes = lanes + 1
  end
end
return lanes
