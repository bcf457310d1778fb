-- Index an event under its session (a sorted set by number, capped).
-- KEYS: the session's audit index. ARGV: number, member (id TAB json), cap.
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
local extra = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[3])
if extra > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, extra - 1) end
return 1
