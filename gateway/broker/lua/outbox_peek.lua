-- Return lapsed leases to the due set, then list up to `limit` due deliveries (id, due).
-- KEYS: due (unleased pending: due time), leased (lease expiry), pend (every pending: due time).
-- ARGV: now, limit.
local now = tonumber(ARGV[1])
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 256)) do
  redis.call('ZREM', KEYS[2], id)
  local due = redis.call('ZSCORE', KEYS[3], id)
  if due then redis.call('ZADD', KEYS[1], due, id) end
end
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
