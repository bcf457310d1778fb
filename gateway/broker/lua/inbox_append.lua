-- Hold an item unless its dedupe key is known; say whether the session needs a ready signal.
-- KEYS: state, inbox, dedupe, claim, rejected. ARGV: now, dedupe key, visibility ms, item json.
-- The dedupe key has no expiry while its item is pending or rejected; `ack` starts its window.
-- Returns {duplicate, id, appended_at, json, status, reason, signal}.
local now, vis = tonumber(ARGV[1]), tonumber(ARGV[3])
local found = redis.call('GET', KEYS[3])
if found then
  local id, at, body = string.match(found, '^(%d+)\t(%d+)\t(.*)$')
  local sid = string.format('%d-0', tonumber(id))
  if #redis.call('XRANGE', KEYS[2], sid, sid) > 0 then
    local signal = 0
    if not claim_live(KEYS[4], now) then signal = signal_wanted(KEYS[1], now, vis) end
    return {1, id, at, body, 'pending', false, signal}
  end
  local reason = redis.call('HGET', KEYS[5], id)
  if reason then return {1, id, at, body, 'rejected', reason, 0} end
  return {1, id, at, body, 'acked', false, 0}
end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local id = string.format('%016d', seq)
redis.call('XADD', KEYS[2], string.format('%d-0', seq), 'a', ARGV[1], 'k', ARGV[2], 'j', ARGV[4])
redis.call('SET', KEYS[3], id .. '\t' .. ARGV[1] .. '\t' .. ARGV[4])
local signal = 0
if not claim_live(KEYS[4], now) then signal = signal_wanted(KEYS[1], now, vis) end
return {0, id, ARGV[1], ARGV[4], 'pending', false, signal}
