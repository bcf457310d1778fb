-- The restore read of one lane (SessionStorage.read_lane_slice). ARGV: lane.
-- Returns {leaf, opened, queued, operation, finished}: the leaf id ('' at the root), then
-- records as flat {seq, timestamp, payload, checksum, ...} lists: the lane's open operation starts
-- (newest first, at most two), its next-run queue records since its newest run start (the
-- caller keeps those without a run id from before the open operation), the records since the
-- open operation's start (only when exactly one is open), and its newest operation_finished.
-- Cost follows what it returns: every range is an index seek.
local lane = ARGV[1]
local leaf = redis.call('HGET', base .. 'lanes', lane)
if not leaf then return err('unknown_lane', 'lane ' .. lane .. ' does not exist') end
local records = base .. 'lr:' .. lane
local function add_at(out, seq) put_record_at(out, records, seq) end
local function newest(index)
  local rows = redis.call('XREVRANGE', index, '+', '-', 'COUNT', 1)
  if rows[1] then return seq_of(rows[1][1]) end
  return nil
end

local opened = {}
local open = redis.call('ZREVRANGE', base .. 'open:' .. lane, 0, 1, 'WITHSCORES')
for i = 2, #open, 2 do add_at(opened, string.format('%d', tonumber(open[i]))) end

local queued = {}
local run_seq = newest(type_index('operation_started', 'run', lane)) or '0'
for _, rtype in ipairs({'queue_enqueued', 'queue_cancelled'}) do
  for _, row in ipairs(redis.call('XRANGE', type_index(rtype, '', lane), '(' .. run_seq .. '-0', '+')) do
    add_at(queued, seq_of(row[1]))
  end
end

local operation = {}
if #opened == 4 then
  for _, row in ipairs(redis.call('XRANGE', records, opened[1] .. '-0', '+')) do
    put_record(operation, row)
  end
end

local finished = {}
local last = newest(type_index('operation_finished', '', lane))
if last then add_at(finished, last) end
return {leaf, opened, queued, operation, finished}
