-- Raise a lane's replied-through mark (never lower it); a lane without state is ignored.
-- KEYS: threads. ARGV: lane, seq. Returns 1 if the mark moved.
if redis.call('HEXISTS', KEYS[1], 't:' .. ARGV[1]) == 0 then return 0 end
local current = tonumber(redis.call('HGET', KEYS[1], 'r:' .. ARGV[1]) or '0')
if tonumber(ARGV[2]) <= current then return 0 end
redis.call('HSET', KEYS[1], 'r:' .. ARGV[1], ARGV[2])
return 1
