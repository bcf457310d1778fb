-- An operator gives up on a dead delivery, or a pending one no deliverer holds now (kept as
-- discarded); others unchanged (one being sent may yet arrive: not while its attempt lasts).
-- KEYS: delivery, due, leased, pend, list:pending, list:dead, deadat, list:discarded, settled.
-- ARGV: now, id. Returns 1 (changed) or 0, then the delivery's fields; nil if there is none.
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local d = redis.call('HMGET', KEYS[1], 'st', 'tok', 'lx')
local held = d[2] and d[3] and tonumber(d[3]) > tonumber(ARGV[1])
local changed = 0
if d[1] == 'dead' or (d[1] == 'pending' and not held) then
  changed = 1
  redis.call('HSET', KEYS[1], 'st', 'discarded', 'set', ARGV[1])
  redis.call('HDEL', KEYS[1], 'tok', 'lx')
  for i = 2, 7 do redis.call('ZREM', KEYS[i], ARGV[2]) end
  redis.call('ZADD', KEYS[8], 0, ARGV[2])
  redis.call('ZADD', KEYS[9], ARGV[1], ARGV[2])
end
local fields = redis.call('HGETALL', KEYS[1])
table.insert(fields, 1, changed)
return fields
