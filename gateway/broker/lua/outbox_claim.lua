-- Lease the listed deliveries that are still due and unleased (another deliverer may have been
-- first); one whose previous lease lapsed unsettled gets `unknown outcome`. KEYS: due, leased,
-- then one delivery hash per id. ARGV: now, lease ms, worker, then id, token
-- pairs in KEYS order (the worker is kept with its lease: `outbox_release`).
-- Returns the claimed deliveries' fields (flat HGETALL lists).
local now = tonumber(ARGV[1])
local expires = now + tonumber(ARGV[2])
local out = {}
for i = 3, #KEYS do
  local id, token = ARGV[2 * i - 2], ARGV[2 * i - 1]
  local due = redis.call('ZSCORE', KEYS[1], id)
  if due and tonumber(due) <= now and redis.call('HGET', KEYS[i], 'st') == 'pending' then
    -- a lapsed lease's attempt never settled: it may have reached the channel
    if redis.call('HEXISTS', KEYS[i], 'tok') == 1 then redis.call('HSET', KEYS[i], 'u', 1) end
    redis.call('HINCRBY', KEYS[i], 'n', 1)
    redis.call('HSET', KEYS[i], 'tok', token, 'lx', expires, 'w', ARGV[3])
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[2], expires, id)
    out[#out + 1] = redis.call('HGETALL', KEYS[i])
  end
end
return out
