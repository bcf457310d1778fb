-- Hold a delivery due now unless its id exists. KEYS: delivery, due, pend, list:pending; on a
-- server (not a cluster) also the outbox bell, rung here. ARGV: id, session, lane, outbound
-- json, now, the shard's hint, bell cap. Returns 1 if it was new.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 's', ARGV[2], 'l', ARGV[3], 'o', ARGV[4],
  'st', 'pending', 'n', 0, 'due', ARGV[5], 'u', 0, 'c', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
redis.call('ZADD', KEYS[4], 0, ARGV[1])
if KEYS[5] then wake(KEYS[5], ARGV[7], 'h', ARGV[6]) end
return 1
