-- Hold an item unless its dedupe key is known; say whether the session needs a ready signal,
-- or whether its holder must be told (a live claim: it waits on the inbox bell for news).
-- KEYS: state, inbox, dedupe, claim, rejected, threads; on a server (not a cluster) also the
-- session's ready stream, the inbox bell and the marks: then the signal and the ring are sent
-- here too, and the mark asked for is read here.
-- ARGV: now, dedupe key, visibility ms, item json, session, ready shard hint, bell cap, lane,
-- the lane's thread json and reply context json ('': the thread is not remembered here), the
-- mark to read ('': none).
-- The dedupe key has no expiry while its item is pending or rejected; `ack` starts its window.
-- Returns {duplicate, id, appended_at, json, status, reason, signal, ring, sent, mark}: sent is
-- 1 when this call sent the signal and the ring it asks for; mark is false unless read here.
-- {2, space}: the lane's thread is of another space (nothing was written).
local now, vis = tonumber(ARGV[1]), tonumber(ARGV[3])
if ARGV[9] ~= '' then  -- a lane is one thread: another space's append is refused, first
  local held = redis.call('HGET', KEYS[6], 't:' .. ARGV[8])
  if held and held ~= ARGV[9] then  -- the same thread again is told by its text
    local space = cjson.decode(held).space
    if space ~= cjson.decode(ARGV[9]).space then return {2, space or ''} end
  end
end
local mark = false
if KEYS[9] and ARGV[11] ~= '' then mark = redis.call('HGET', KEYS[9], ARGV[11]) end
local function told(signal, ring)
  if not KEYS[7] then return signal, ring, 0 end
  if signal == 1 then
    redis.call('XADD', KEYS[7], '*', 's', ARGV[5])
    wake(KEYS[8], ARGV[7], 'h', ARGV[6])
  end
  if ring == 1 then wake(KEYS[8], ARGV[7], 's', ARGV[5]) end
  return signal, ring, 1
end
local function needs()
  if claim_live(KEYS[4], now) then return 0, 1 end
  return signal_wanted(KEYS[1], now, vis), 0
end
local found = redis.call('GET', KEYS[3])
if found then
  local id, at, body = string.match(found, '^(%d+)\t(%d+)\t(.*)$')
  local sid = string.format('%d-0', tonumber(id))
  if #redis.call('XRANGE', KEYS[2], sid, sid) > 0 then
    local signal, ring, sent = told(needs())
    return {1, id, at, body, 'pending', false, signal, ring, sent, mark}
  end
  local reason = redis.call('HGET', KEYS[5], id)
  if reason then return {1, id, at, body, 'rejected', reason, 0, 0, 0, mark} end
  return {1, id, at, body, 'acked', false, 0, 0, 0, mark}
end
if ARGV[9] ~= '' then  -- `threads.remember`, in the same call (not a duplicate's: D318)
  redis.call('HSETNX', KEYS[6], 't:' .. ARGV[8], ARGV[9])  -- its first thread stays
  redis.call('HSET', KEYS[6], 'c:' .. ARGV[8], ARGV[10])
end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local id = string.format('%016d', seq)
redis.call('XADD', KEYS[2], string.format('%d-0', seq), 'a', ARGV[1], 'k', ARGV[2], 'j', ARGV[4])
redis.call('SET', KEYS[3], id .. '\t' .. ARGV[1] .. '\t' .. ARGV[4])
local signal, ring, sent = told(needs())
return {0, id, ARGV[1], ARGV[4], 'pending', false, signal, ring, sent, mark}
