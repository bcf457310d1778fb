-- Extend a claim that is still this ticket's. KEYS: claim. ARGV: token, now, visibility ms.
-- Returns the new expiry, or 0.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local exp = tonumber(ARGV[2]) + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'exp', exp)
return exp
