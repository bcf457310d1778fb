-- An operator gives up on a pending or dead delivery (kept as discarded); others unchanged.
-- KEYS: delivery, due, leased, pend, list:pending, list:dead, deadat, list:discarded, settled.
-- ARGV: now, id. Returns the delivery's fields, or nil if there is none.
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local st = redis.call('HGET', KEYS[1], 'st')
if st == 'pending' or st == 'dead' then
  redis.call('HSET', KEYS[1], 'st', 'discarded', 'set', ARGV[1])
  redis.call('HDEL', KEYS[1], 'tok', 'lx')
  for i = 2, 7 do redis.call('ZREM', KEYS[i], ARGV[2]) end
  redis.call('ZADD', KEYS[8], 0, ARGV[2])
  redis.call('ZADD', KEYS[9], ARGV[1], ARGV[2])
end
return redis.call('HGETALL', KEYS[1])
