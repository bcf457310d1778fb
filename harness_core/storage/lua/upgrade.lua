-- Bring a session of an older layout up to LAYOUT, atomically. Layout 2 added the per-lane type
-- indexes, the run index and the lane and entry usage sums, built from the lane record streams
-- (usage sums in seq order, as the writes would have kept them); layout 3 the session-wide index
-- of open operations (':opens', run ids scored by seq), built from the per-lane ':open:<lane>'
-- sets. ARGV: none. Returns 1 if it upgraded, 0 if up to date.
local from = redis.call('HGET', meta, 'layout')
if redis.call('EXISTS', meta) == 0 or from == LAYOUT then
  return 0
end
if from ~= '2' then
  -- read and check everything first: a script that fails halfway keeps its writes
  local indexed, runs, usage = {}, {}, {}
  for _, lane in ipairs(redis.call('HKEYS', base .. 'lanes')) do
    for _, item in ipairs(redis.call('XRANGE', base .. 'lr:' .. lane, '-', '+')) do
      local id, fields = item[1], item[2]
      local payload
      for i = 1, #fields, 2 do
        if fields[i] == 'd' then payload = fields[i + 1] end
      end
      local record = cjson.decode(payload)
      local seq = tonumber(string.match(id, '^(%d+)'))
      indexed[#indexed + 1] = {type_index(record.type, nil, lane), id}
      local run = record.type == 'operation_started' and record.id or record.run_id
      if type(run) == 'string' then runs[#runs + 1] = run_member(run, seq, lane) end
      if record.type == 'operation_started' then
        indexed[#indexed + 1] = {type_index(record.type, record.intent.kind, lane), id}
      elseif record.type == 'usage' then
        usage[#usage + 1] = {seq, lane, record}
      end
    end
  end
  table.sort(usage, function(a, b) return a[1] < b[1] end)
  local lanes, entries = {}, {}
  for _, item in ipairs(usage) do
    local lane, record = item[2], item[3]
    local u, c = record.usage, record.usage.cost
    local amounts = {u.input, u.output, u.cache_read, u.cache_write, u.total_tokens,
      c.input, c.output, c.cache_read, c.cache_write, c.total}
    local entry = type(record.entry_id) == 'string' and record.entry_id or nil
    lanes[lane] = usage_add(lanes[lane] or usage_zero(), amounts)
    if entry then entries[entry] = usage_add(entries[entry] or usage_zero(), amounts) end
    if not lanes[lane] or (entry and not entries[entry]) then
      return err('corrupt', 'a usage sum of the session leaves its range')
    end
  end
  -- lanes were read one after the other: each index stream gets its ids in increasing order
  for _, pair in ipairs(indexed) do redis.call('XADD', pair[1], pair[2], 'r', '') end
  for _, member in ipairs(runs) do redis.call('ZADD', base .. 'runs', 0, member) end
  for lane, sums in pairs(lanes) do redis.call('HSET', base .. 'ul', lane, usage_pack(sums)) end
  for entry, sums in pairs(entries) do redis.call('HSET', base .. 'ue', entry, usage_pack(sums)) end
end
for _, lane in ipairs(redis.call('HKEYS', base .. 'lanes')) do
  local open = redis.call('ZRANGE', base .. 'open:' .. lane, 0, -1, 'WITHSCORES')
  for i = 1, #open, 2 do redis.call('ZADD', base .. 'opens', open[i + 1], open[i]) end
end
redis.call('HSET', meta, 'layout', LAYOUT)
return 1
