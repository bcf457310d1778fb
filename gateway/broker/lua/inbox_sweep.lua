-- A session whose ready signal may have been lost: pending items, no live claim, no recent
-- signal. KEYS: state, inbox, claim. ARGV: now, visibility ms. Returns 1 to signal it.
local now, vis = tonumber(ARGV[1]), tonumber(ARGV[2])
if redis.call('XLEN', KEYS[2]) == 0 then return 0 end
if claim_live(KEYS[3], now) then return 0 end
return signal_wanted(KEYS[1], now, vis)
