-- Append an event to the capped audit stream under the next number (stream id = number).
-- KEYS: counter, stream. ARGV: approximate cap, event json. Returns the number.
local n = redis.call('INCR', KEYS[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], string.format('%d-0', n), 'j', ARGV[2])
return n
