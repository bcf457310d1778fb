-- Every lane's replied-through mark of one session back to 0 (its store history was replaced).
-- KEYS: threads. Returns how many lanes had a mark.
local lowered = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, 2) == 'r:' then
    redis.call('HDEL', KEYS[1], field)
    lowered = lowered + 1
  end
end
return lowered
