-- A dead letter back to pending, due now, attempts reset; anything else unchanged.
-- KEYS: delivery, due, pend, list:dead, list:pending, deadat; on a server (not a cluster) also
-- the outbox bell, rung here. ARGV: now, id, the shard's hint, bell cap.
-- Returns 1 (changed) or 0, then the delivery's fields; nil if there is none.
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local changed = 0
if redis.call('HGET', KEYS[1], 'st') == 'dead' then
  changed = 1
  redis.call('HSET', KEYS[1], 'st', 'pending', 'n', 0, 'due', ARGV[1])
  redis.call('HDEL', KEYS[1], 'set', 'tok', 'lx')
  redis.call('ZREM', KEYS[4], ARGV[2])
  redis.call('ZREM', KEYS[6], ARGV[2])
  redis.call('ZADD', KEYS[5], 0, ARGV[2])
  redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
  redis.call('ZADD', KEYS[3], ARGV[1], ARGV[2])
  if KEYS[7] then wake(KEYS[7], ARGV[4], 'h', ARGV[3]) end
end
local fields = redis.call('HGETALL', KEYS[1])
table.insert(fields, 1, changed)
return fields
