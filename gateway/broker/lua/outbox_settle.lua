-- Settle a claim whose token is still the delivery's: delivered, retry (due again) or dead.
-- KEYS: delivery, due, leased, pend, list:pending, list:<target status>, the target's time
-- index (settled or deadat); on a server (not a cluster) also the outbox bell, rung here for a
-- retry. ARGV: mode, token, now, due at, reason, unknown outcome (0/1), id, the shard's hint,
-- bell cap.
-- Returns 1 if settled, 0 if the claim was superseded (or the delivery is no longer pending).
local h = redis.call('HMGET', KEYS[1], 'st', 'tok')
if h[1] ~= 'pending' or h[2] ~= ARGV[2] then return 0 end
local id = ARGV[7]
redis.call('ZREM', KEYS[3], id)
redis.call('HDEL', KEYS[1], 'tok', 'lx')
if ARGV[1] == 'retry' then
  redis.call('HSET', KEYS[1], 'due', ARGV[4], 'err', ARGV[5], 'u', ARGV[6])
  redis.call('ZADD', KEYS[2], ARGV[4], id)
  redis.call('ZADD', KEYS[4], ARGV[4], id)
  if KEYS[8] then wake(KEYS[8], ARGV[9], 'h', ARGV[8]) end
  return 1
end
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[4], id)
redis.call('ZREM', KEYS[5], id)
redis.call('ZADD', KEYS[6], 0, id)
redis.call('ZADD', KEYS[7], ARGV[3], id)
if ARGV[1] == 'dead' then
  redis.call('HSET', KEYS[1], 'st', 'dead', 'err', ARGV[5], 'set', ARGV[3])
else
  redis.call('HSET', KEYS[1], 'st', 'delivered', 'set', ARGV[3])
end
return 1
