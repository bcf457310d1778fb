-- End one worker's live leases in one shard: its process is gone (D397). Each is lapsed now
-- (its token kept), so the next claim takes it with `unknown outcome` set. The deliveries'
-- hashes are KEYS[1]'s shard prefix and `o:<id>`, in its slot.
-- KEYS: leased. ARGV: now, worker. Returns the released ids.
local now = tonumber(ARGV[1])
local base = string.sub(KEYS[1], 1, -7)  -- '<prefix>:{obx-<n>}:' of '...:leased'
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf')) do
  local key = base .. 'o:' .. id
  if redis.call('HGET', key, 'w') == ARGV[2] and redis.call('HGET', key, 'st') == 'pending' then
    redis.call('HSET', key, 'lx', now)
    redis.call('ZADD', KEYS[1], now, id)
    out[#out + 1] = id
  end
end
return out
