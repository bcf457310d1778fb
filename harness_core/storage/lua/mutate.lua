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
  -- lane, id, type, run_id of an operation_finished ('' otherwise), payload, then for usage
  -- records 5 token and 5 cost deltas
  local lane, id, rtype, finished, payload = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
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
  redis.call('XADD', base .. 'lr:' .. lane, sid, 't', ts, 'd', payload)
  redis.call('HSET', base .. 'rid', id, table.concat({seq, rtype, lane}, '\t'))
  if rtype == 'operation_started' then
    redis.call('ZADD', base .. 'open:' .. lane, seq, id)
  elseif rtype == 'operation_finished' then
    redis.call('ZREM', base .. 'open:' .. lane, finished)
  end
  redis.call('XADD', base .. 'log', sid, 'k', 'r', 'lane', lane, 't', ts)
  counts.n_records = counts.n_records + 1
  if ARGV[9] then
    local ints = {'u_input', 'u_output', 'u_cache_read', 'u_cache_write', 'u_total_tokens'}
    local floats = {'c_input', 'c_output', 'c_cache_read', 'c_cache_write', 'c_total'}
    for i = 1, 5 do redis.call('HINCRBY', meta, ints[i], ARGV[8 + i]) end
    for i = 1, 5 do
      -- exact IEEE double sums printed to round-trip (HINCRBYFLOAT adds in long double)
      local sum = tonumber(redis.call('HGET', meta, floats[i])) + tonumber(ARGV[13 + i])
      redis.call('HSET', meta, floats[i], string.format('%.17g', sum))
    end
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
if ttl and 2 * (expires - now) < ttl then
  redis.call('HSET', base .. 'lease', 'expires', string.format('%d', now + ttl))
end
table.insert(result, 2, seq)
table.insert(result, 3, ts)
return result
