-- One atomic step on a ready shard. KEYS: ready stream, claims (zset: "token anchor session" ->
-- expiry); on a server (not a cluster) also the inbox bell, rung here for a signal. ARGV:
-- session to signal (XADD), entry to ack (XACK + XDEL), claim member to remove, claim member
-- to add, its expiry, entry to move to a consumer (XCLAIM: resets its idle time), that
-- consumer, the shard's hint, bell cap. '' skips a part. Returns the new entry's id (or '').
local added = ''
if ARGV[1] ~= '' then
  added = redis.call('XADD', KEYS[1], '*', 's', ARGV[1])
  if KEYS[3] then wake(KEYS[3], ARGV[9], 'h', ARGV[8]) end
end
if ARGV[2] ~= '' then
  redis.call('XACK', KEYS[1], GROUP, ARGV[2])
  redis.call('XDEL', KEYS[1], ARGV[2])
end
if ARGV[3] ~= '' then redis.call('ZREM', KEYS[2], ARGV[3]) end
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4]) end
if ARGV[6] ~= '' then redis.call('XCLAIM', KEYS[1], GROUP, ARGV[7], 0, ARGV[6], 'JUSTID') end
return added
