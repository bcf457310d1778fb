-- Consider a ready entry (fresh, or the anchor of an expired claim) for a worker.
-- KEYS: state, inbox, claim; on a server (not a cluster) also the inbox bell. ARGV: entry id,
-- new token, worker, now, visibility ms, old token ('' for a fresh entry; else the claim this
-- recovery expects to find), session, bell cap.
-- A lapsed claim (its worker died, or `done` deferred the session) is handed out again with
-- nothing pending: an operation may be left open; its old holder, if it still waits on the
-- session, is told (a ring naming the session: here with the bell key, else by the caller).
-- Without a claim, only pending items count.
-- Returns {outcome, exp, over}: taken (exp of the new claim; over 1 when it replaced a lapsed
-- claim whose holder is yet to be told), park (the entry anchors a live claim), drop (another
-- live claim holds the session), empty (no claim, nothing pending), live (the expected claim
-- was renewed: its exp), stale (the expected claim was replaced).
local now, vis, old = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local live, c = claim_live(KEYS[3], now)
if live then
  if old ~= '' then
    if c[1] == old then return {'live', c[3], 0} end
    return {'stale', 0, 0}
  end
  if c[2] == ARGV[1] then return {'park', 0, 0} end
  return {'drop', 0, 0}
end
if not c[1] and redis.call('XLEN', KEYS[2]) == 0 then
  redis.call('HDEL', KEYS[1], 'sig')
  return {'empty', 0, 0}
end
local exp = now + vis
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'token', ARGV[2], 'anchor', ARGV[1], 'worker', ARGV[3], 'exp', exp)
redis.call('HDEL', KEYS[1], 'sig')
local over = 0
if c[1] then
  if KEYS[4] then wake(KEYS[4], ARGV[8], 's', ARGV[7]) else over = 1 end
end
return {'taken', exp, over}
