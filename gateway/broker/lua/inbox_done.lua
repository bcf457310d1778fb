-- End a ticket that is still the session's claim; say whether the session needs a ready signal.
-- KEYS: state, inbox, claim. ARGV: token, now, visibility ms, again in ms ('' for none), the
-- token of the deferred claim. Without `again`, the claim is released (and the session
-- signalled if items are pending). With it, the claim lapses `again` ms from now, held by
-- nobody: then it is handed out again, pending items or not.
-- Returns {outcome, signal, exp, anchor}: outcome 0 (not this ticket's, or no claim),
-- 1 (released) or 2 (deferred until exp).
local now, vis = tonumber(ARGV[2]), tonumber(ARGV[3])
local c = redis.call('HMGET', KEYS[3], 'token', 'anchor')
local released = 0
if c[1] then
  if c[1] ~= ARGV[1] then return {0, 0, 0, ''} end
  if ARGV[4] ~= '' then
    local exp = now + math.max(0, tonumber(ARGV[4]))
    redis.call('HSET', KEYS[3], 'token', ARGV[5], 'worker', '', 'exp', exp)
    return {2, 0, exp, c[2]}
  end
  redis.call('DEL', KEYS[3])
  released = 1
end
if redis.call('XLEN', KEYS[2]) == 0 then return {released, 0, 0, ''} end
return {released, signal_wanted(KEYS[1], now, vis), 0, ''}
