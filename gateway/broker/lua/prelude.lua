-- Shared by every broker script. Every key a script touches shares one hash tag (one cluster
-- slot): a session's keys carry {<session>}, a shard's keys {rdy-<n>} or {obx-<n>}. Each is in
-- KEYS but the deliveries `outbox_take` finds, whose keys it builds from its shard's prefix.
-- Times are milliseconds on the caller's clock, passed in ARGV (never the server's TIME).
local GROUP = 'workers'
-- A ready signal older than the visibility timeout no longer suppresses a new one (it may have
-- been lost between the session's script and the shard's XADD).
local function signal_wanted(state, now, vis)
  local sig = redis.call('HGET', state, 'sig')
  if sig and math.abs(now - tonumber(sig)) < vis then return 0 end
  redis.call('HSET', state, 'sig', now)
  return 1
end
local function claim_live(claim, now)
  local c = redis.call('HMGET', claim, 'token', 'anchor', 'exp')
  return c[1] and tonumber(c[3]) > now, c
end
-- Ring a bell (a capped stream each broker's listener reads): `field` is h (a hint: a ready
-- shard, the claims hint) or s (a session whose holder must look at its inbox).
local function wake(bell, cap, field, value)
  redis.call('XADD', bell, 'MAXLEN', '~', cap, '*', field, value)
end
