-- The workers holding a live lease in one shard, each once. KEYS: leased. ARGV: now.
local base = string.sub(KEYS[1], 1, -7)  -- '<prefix>:{obx-<n>}:' of '...:leased'
local seen, out = {}, {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf')) do
  local worker = redis.call('HGET', base .. 'o:' .. id, 'w')
  if worker and not seen[worker] then
    seen[worker] = true
    out[#out + 1] = worker
  end
end
return out
