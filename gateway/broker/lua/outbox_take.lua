-- A claim from one shard in one call: `outbox_peek` then `outbox_claim` of what it listed (the
-- two a claim over several shards makes), and when the shard may next hold something
-- claimable, so the deliverer's wait need not read it again. The deliveries' hashes are not in
-- KEYS (they are known only here): each is KEYS[1]'s shard prefix and `o:<id>`, in its slot.
-- KEYS: due, leased, pend. ARGV: now, lease ms, worker (kept with its lease: `outbox_release`),
-- then one token per delivery it may lease.
-- Returns {next (the first due time or lease expiry left; false: none), claimed deliveries'
-- fields (flat HGETALL lists)...}.
local now = tonumber(ARGV[1])
local expires = now + tonumber(ARGV[2])
local base = string.sub(KEYS[1], 1, -4)  -- '<prefix>:{obx-<n>}:' of '...:due'
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 256)) do
  redis.call('ZREM', KEYS[2], id)
  local due = redis.call('ZSCORE', KEYS[3], id)
  if due then redis.call('ZADD', KEYS[1], due, id) end
end
local out = {false}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, #ARGV - 3)
for i, id in ipairs(due) do
  local key = base .. 'o:' .. id
  if redis.call('HGET', key, 'st') == 'pending' then
    if redis.call('HEXISTS', key, 'tok') == 1 then redis.call('HSET', key, 'u', 1) end
    redis.call('HINCRBY', key, 'n', 1)
    redis.call('HSET', key, 'tok', ARGV[3 + i], 'lx', expires, 'w', ARGV[3])
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[2], expires, id)
    out[#out + 1] = redis.call('HGETALL', key)
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local lapse = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local next_at = first[2]
if lapse[2] and (not next_at or tonumber(lapse[2]) < tonumber(next_at)) then next_at = lapse[2] end
if next_at then out[1] = next_at end
return out
