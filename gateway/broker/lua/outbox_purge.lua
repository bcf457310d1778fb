-- Delete settled deliveries whose retention passed. KEYS: the time index read (settled or
-- deadat), list:delivered, list:dead, list:discarded, then one delivery hash per id.
-- ARGV: cutoff, then the ids in KEYS order. Returns how many were deleted.
local cutoff = tonumber(ARGV[1])
local lists = {delivered = KEYS[2], dead = KEYS[3], discarded = KEYS[4]}
local n = 0
for i = 5, #KEYS do
  local id = ARGV[i - 3]
  local h = redis.call('HMGET', KEYS[i], 'st', 'set')
  if h[1] and lists[h[1]] and h[2] and tonumber(h[2]) <= cutoff then
    redis.call('DEL', KEYS[i])
    redis.call('ZREM', lists[h[1]], id)
    redis.call('ZREM', KEYS[1], id)
    n = n + 1
  elseif not (h[1] and lists[h[1]]) then
    redis.call('ZREM', KEYS[1], id)
  end
end
return n
