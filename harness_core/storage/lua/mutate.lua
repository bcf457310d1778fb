-- One mutation of a session, atomically: check the fencing token, allocate seq, append to the
-- session log stream and update every projection.
-- ARGV[1] op (entry|record|lane|fact), ARGV[2] lease token ('' = import), ARGV[3] now ('' = the
-- server's clock; an import passes the item's timestamp), ARGV[4..] the op's arguments.
local op, token = ARGV[1], ARGV[2]
local now = clock(ARGV[3])
local m = redis.call('HMGET', meta, 'seq', 'importing', 'n_entries', 'n_messages', 'n_records')
if not m[1] then return err('not_found', 'session does not exist') end
local trusted = token == ''
local ttl, expires = nil, nil
if trusted then
  if m[2] ~= '1' then return err('invalid_query', 'unfenced writes are only for imports') end
else
  if m[2] == '1' then return err('not_found', 'session is an incomplete import') end
  local l = redis.call('HMGET', base .. 'lease', 'token', 'expires', 'ttl')
  if l[1] ~= token then
    return err('lease_lost', 'writer lease ' .. token .. ' was superseded or released')
  end
  if tonumber(l[2]) <= now then
    return err('lease_lost', 'writer lease ' .. token .. ' expired at ' .. l[2])
  end
  ttl, expires = tonumber(l[3]), tonumber(l[2])
end
local seq = tonumber(m[1]) + 1
local sid = seq .. '-0'
local ts = string.format('%d', now)
local result

local counts = {n_entries = tonumber(m[3]), n_messages = tonumber(m[4]), n_records = tonumber(m[5])}
local function used(id)
  return redis.call('HEXISTS', base .. 'ep', id) == 1 or redis.call('HEXISTS', base .. 'rid', id) == 1
end

if op == 'entry' then
  -- lane ('' = imported without a lane), id, type, custom_type ('' = none), payload,
  -- if_missing ('1'/'0'), parent (imports only)
  local lane, id, etype, custom, payload = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
  local parent
  if trusted then
    parent = ARGV[10]
  else
    parent = redis.call('HGET', base .. 'lanes', lane)
    if not parent then return err('unknown_lane', 'lane ' .. lane .. ' does not exist') end
    local existing = redis.call('HGET', base .. 'ep', id)
    if existing and ARGV[9] == '1' then
      if existing == payload then return {'existing', redis.call('HGET', base .. 'en', id)} end
      return err('content_mismatch',
        'entry ' .. id .. ' exists with different content (provisioned-id corruption)')
    end
    if existing or redis.call('HEXISTS', base .. 'rid', id) == 1 then
      return err('already_exists', 'id ' .. id .. ' is already used in this session')
    end
  end
  local node = table.concat({seq, ts, parent, lane, etype, custom}, '\t')
  redis.call('HSET', base .. 'ep', id, payload)
  redis.call('HSET', base .. 'en', id, node)
  redis.call('ZADD', base .. 'eseq', seq, id)
  if custom ~= '' then
    redis.call('ZADD', base .. 'ec:' .. custom, seq, id)
    redis.call('SADD', base .. 'ctypes', custom)
  end
  if lane ~= '' then redis.call('HSET', base .. 'lanes', lane, id) end
  redis.call('XADD', base .. 'log', sid, 'k', 'e', 'id', id, 't', ts)
  counts.n_entries = counts.n_entries + 1
  if etype == 'message' then counts.n_messages = counts.n_messages + 1 end
  result = {'ok', node}

elseif op == 'record' then
  -- lane, id, type, the record's run (an operation start's own id, else its run_id; '' = none),
  -- payload, the operation kind of an operation_started ('' otherwise), then for usage records
  -- the entry id ('' = none) and 5 token and 5 cost amounts
  local lane, id, rtype, run, payload, kind = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
  if not trusted then
    if redis.call('HEXISTS', base .. 'lanes', lane) == 0 then
      return err('unknown_lane', 'lane ' .. lane .. ' does not exist')
    end
    if used(id) then return err('already_exists', 'id ' .. id .. ' is already used in this session') end
    if rtype == 'operation_started' then
      local busy = redis.call('ZREVRANGE', base .. 'open:' .. lane, 0, 0)
      if busy[1] then
        return err('lane_busy', 'lane ' .. lane .. ' already has open operation ' .. busy[1])
      end
    end
  end
  -- usage: every running sum (session, lane, entry) is computed and checked before any write,
  -- one addition per record in seq order, so the sums equal the reference's
  local sums = nil
  if ARGV[11] then
    local amounts = {}
    for i = 1, 10 do amounts[i] = tonumber(ARGV[10 + i]) end
    local entry = ARGV[10]
    local stored = redis.call('HMGET', meta, unpack(USAGE_FIELDS))
    local current = {}
    for i = 1, 10 do current[i] = tonumber(stored[i]) end
    local session = usage_add(current, amounts)
    local lane_sum = usage_add(usage_unpack(redis.call('HGET', base .. 'ul', lane)), amounts)
    local entry_sum = nil
    if entry ~= '' then
      entry_sum = usage_add(usage_unpack(redis.call('HGET', base .. 'ue', entry)), amounts)
    end
    if not session or not lane_sum or (entry ~= '' and not entry_sum) then
      return err('invalid_payload', 'usage record ' .. id .. ' would take a usage sum out of range')
    end
    sums = {session = session, lane = lane_sum, entry = entry_sum, entry_id = entry}
  end
  redis.call('XADD', base .. 'lr:' .. lane, sid, 't', ts, 'd', payload)
  redis.call('XADD', type_index(rtype, nil, lane), sid, 'r', '')
  if kind ~= '' then redis.call('XADD', type_index(rtype, kind, lane), sid, 'r', '') end
  if run ~= '' then redis.call('ZADD', base .. 'runs', 0, run_member(run, seq, lane)) end
  redis.call('HSET', base .. 'rid', id, table.concat({seq, rtype, lane}, '\t'))
  if rtype == 'operation_started' then
    redis.call('ZADD', base .. 'open:' .. lane, seq, id)
    redis.call('ZADD', base .. 'opens', seq, id)
  elseif rtype == 'operation_finished' then
    redis.call('ZREM', base .. 'open:' .. lane, run)
    redis.call('ZREM', base .. 'opens', run)
  end
  redis.call('XADD', base .. 'log', sid, 'k', 'r', 'lane', lane, 't', ts)
  counts.n_records = counts.n_records + 1
  if sums then
    local fields = {}
    for i = 1, 10 do
      fields[2 * i - 1], fields[2 * i] = USAGE_FIELDS[i], usage_format(i, sums.session[i])
    end
    redis.call('HSET', meta, unpack(fields))
    redis.call('HSET', base .. 'ul', lane, usage_pack(sums.lane))
    if sums.entry then redis.call('HSET', base .. 'ue', sums.entry_id, usage_pack(sums.entry)) end
  end
  result = {'ok'}

elseif op == 'lane' then
  -- lane, leaf ('' = root), created ('1'/'0')
  local lane, leaf, created = ARGV[4], ARGV[5], ARGV[6]
  if not trusted then
    local exists = redis.call('HEXISTS', base .. 'lanes', lane) == 1
    if created == '1' and exists then
      return err('already_exists', 'lane ' .. lane .. ' already exists')
    end
    if created == '0' and not exists then
      return err('unknown_lane', 'lane ' .. lane .. ' does not exist')
    end
    if leaf ~= '' and redis.call('HEXISTS', base .. 'en', leaf) == 0 then
      return err('not_found', 'entry ' .. leaf .. ' does not exist')
    end
  end
  redis.call('HSET', base .. 'lanes', lane, leaf)
  redis.call('XADD', base .. 'log', sid, 'k', 'l', 'lane', lane, 'leaf', leaf, 'c', created, 't', ts)
  result = {'ok'}

elseif op == 'fact' then
  -- payload, then 'name' and the name, or 'label', the target, the label and '1' if it clears
  local payload, kind = ARGV[4], ARGV[5]
  if kind == 'name' then
    redis.call('HSET', meta, 'name', ARGV[6])
  else
    local target = ARGV[6]
    if not trusted and redis.call('HEXISTS', base .. 'en', target) == 0 then
      return err('not_found', 'entry ' .. target .. ' does not exist')
    end
    if ARGV[8] == '1' then
      redis.call('HDEL', base .. 'labels', target)
    else
      redis.call('HSET', base .. 'labels', target, ARGV[7])
    end
  end
  redis.call('XADD', base .. 'log', sid, 'k', 'f', 'd', payload, 't', ts)
  result = {'ok'}
else
  return err('invalid_query', 'unknown op ' .. op)
end

redis.call('HSET', meta, 'seq', seq, 'n_entries', counts.n_entries, 'n_messages', counts.n_messages,
  'n_records', counts.n_records)
-- a write renews its writer's lease once less than half of the ttl is left
local renewed = ''
if ttl and 2 * (expires - now) < ttl then
  renewed = string.format('%d', now + ttl)
  redis.call('HSET', base .. 'lease', 'expires', renewed)
end
-- {status, seq, timestamp, the lease's new expiry ('' = unchanged), op-specific values...}
table.insert(result, 2, seq)
table.insert(result, 3, ts)
table.insert(result, 4, renewed)
return result
