-- Mutations of one session, in order, atomically (one group commit): each checks its writer's
-- fencing token, allocates the next seq, appends to the session log stream and updates every
-- projection. A refused mutation writes nothing and the others go on, as if each were its own
-- call; the session's counters and the lease's renewal are written once, at the end.
-- ARGV: one argument per mutation, its fields framed as '<byte length>:<bytes>' one after the
-- other: op (entry|record|lane|fact), lease token ('' = import), now ('' = the server's clock;
-- an import passes the item's timestamp), then the op's own arguments (A[1..] below).
-- An op written '+op' is chained: it is refused (code 'skipped') once an earlier mutation of the
-- call was refused, so writes a storage deferred and sends together stay a prefix (D283).
-- Returns one reply per mutation: {'ok', seq, timestamp, the lease's new expiry ('' = unchanged),
-- op-specific values...}, {'existing', node}, or {'error', 'GW <code> <message>'}.
local function refuse(code, msg) return {'error', 'GW ' .. code .. ' ' .. msg} end
local m = redis.call('HMGET', meta, 'seq', 'importing', 'n_entries', 'n_messages', 'n_records')
local seq = tonumber(m[1])
local counts = {n_entries = tonumber(m[3]), n_messages = tonumber(m[4]), n_records = tonumber(m[5])}
local lease = nil  -- {token, expires, ttl}, read once
local server_now = nil
local renewed = ''
local wrote = false

local function used(id)
  return redis.call('HEXISTS', base .. 'ep', id) == 1 or redis.call('HEXISTS', base .. 'rid', id) == 1
end

local function apply(op, token, now, A)
  local err = refuse
  if not seq then return err('not_found', 'session does not exist') end
  local trusted = token == ''
  if trusted then
    if m[2] ~= '1' then return err('invalid_query', 'unfenced writes are only for imports') end
  else
    if m[2] == '1' then return err('not_found', 'session is an incomplete import') end
    if not lease then
      local l = redis.call('HMGET', base .. 'lease', 'token', 'expires', 'ttl')
      lease = {l[1], tonumber(l[2]), tonumber(l[3])}
    end
    if lease[1] ~= token then
      return err('lease_lost', 'writer lease ' .. token .. ' was superseded or released')
    end
    if lease[2] <= now then
      return err('lease_lost', 'writer lease ' .. token .. ' expired at ' .. string.format('%d', lease[2]))
    end
  end
  local seq = seq + 1
  local sid = seq .. '-0'
  local ts = string.format('%d', now)
  local result

  if op == 'entry' then
    -- lane ('' = imported without a lane), id, type, custom_type ('' = none), payload,
    -- if_missing ('1'/'0'), the payload's checksum, parent (imports only)
    local lane, id, etype, custom, payload, crc = A[1], A[2], A[3], A[4], A[5], A[7]
    local parent
    if trusted then
      parent = A[8]
    else
      parent = redis.call('HGET', base .. 'lanes', lane)
      if not parent then return err('unknown_lane', 'lane ' .. lane .. ' does not exist') end
      local existing = redis.call('HGET', base .. 'ep', id)
      if existing and A[6] == '1' then
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
    redis.call('HSET', base .. 'ek', id, crc)
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
    -- payload, the operation kind of an operation_started ('' otherwise), the payload's
    -- checksum, then for usage records the entry id ('' = none) and 5 token and 5 cost amounts
    local lane, id, rtype, run, payload, kind, crc = A[1], A[2], A[3], A[4], A[5], A[6], A[7]
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
    if A[9] then
      local amounts = {}
      for i = 1, 10 do amounts[i] = tonumber(A[8 + i]) end
      local entry = A[8]
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
    redis.call('XADD', base .. 'lr:' .. lane, sid, 't', ts, 'd', payload, 'crc', crc)
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
    -- lane, leaf ('' = root), created ('1'/'0'), the checksum of those three
    local lane, leaf, created, crc = A[1], A[2], A[3], A[4]
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
    redis.call('XADD', base .. 'log', sid, 'k', 'l', 'lane', lane, 'leaf', leaf, 'c', created, 't', ts,
      'crc', crc)
    result = {'ok'}

  elseif op == 'fact' then
    -- payload, its checksum, then 'name' and the name, or 'label', the target, the label and '1'
    -- if it clears
    local payload, crc, kind = A[1], A[2], A[3]
    if kind == 'name' then
      redis.call('HSET', meta, 'name', A[4])
    else
      local target = A[4]
      if not trusted and redis.call('HEXISTS', base .. 'en', target) == 0 then
        return err('not_found', 'entry ' .. target .. ' does not exist')
      end
      if A[6] == '1' then
        redis.call('HDEL', base .. 'labels', target)
      else
        redis.call('HSET', base .. 'labels', target, A[5])
      end
    end
    redis.call('XADD', base .. 'log', sid, 'k', 'f', 'd', payload, 't', ts, 'crc', crc)
    result = {'ok'}
  else
    return err('invalid_query', 'unknown op ' .. op)
  end

  -- applied
  if not trusted then
    -- a write renews its writer's lease once less than half of the ttl is left
    local ttl, expires = lease[3], lease[2]
    if ttl and 2 * (expires - now) < ttl then
      lease[2] = now + ttl
      renewed = string.format('%d', lease[2])
    end
  end
  table.insert(result, 2, seq)
  table.insert(result, 3, ts)
  table.insert(result, 4, '')
  return result
end

local function fields(framed)
  local out, pos = {}, 1
  while pos <= #framed do
    local colon = string.find(framed, ':', pos, true)
    local stop = colon + tonumber(string.sub(framed, pos, colon - 1))
    out[#out + 1] = string.sub(framed, colon + 1, stop)
    pos = stop + 1
  end
  return out
end

local replies = {}
local refused = false
for i = 1, #ARGV do
  local F = fields(ARGV[i])
  local A = {}
  for k = 4, #F do A[k - 3] = F[k] end
  local now = tonumber(F[3])
  if not now then
    if not server_now then server_now = clock('') end
    now = server_now
  end
  local op = F[1]
  local chained = string.sub(op, 1, 1) == '+'
  if chained then op = string.sub(op, 2) end
  local reply
  if chained and refused then
    reply = refuse('skipped', 'an earlier write of its batch was refused')
  else
    reply = apply(op, F[2], now, A)
  end
  if reply[1] == 'error' then refused = true end
  if reply[1] == 'ok' then
    seq = reply[2]
    wrote = true
  end
  replies[i] = reply
end

if wrote then
  redis.call('HSET', meta, 'seq', seq, 'n_entries', counts.n_entries, 'n_messages',
    counts.n_messages, 'n_records', counts.n_records)
end
if renewed ~= '' then
  redis.call('HSET', base .. 'lease', 'expires', renewed)
  -- every write of the batch reports the renewal its writer's lease got
  for _, reply in ipairs(replies) do
    if reply[1] == 'ok' then reply[4] = renewed end
  end
end
return replies
