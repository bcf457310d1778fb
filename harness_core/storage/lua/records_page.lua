-- One page of a lane's record index, with the records (one call instead of two).
-- ARGV: the index key's suffix, lane, low id, high id, '1' for newest first, count.
-- Returns {seqs, records}: every seq the index gave (to move the caller's window), then the
-- records found at them as flat {seq, timestamp, payload, checksum} quadruples.
local records = base .. 'lr:' .. ARGV[2]
local rows
if ARGV[5] == '1' then
  rows = redis.call('XREVRANGE', base .. ARGV[1], ARGV[4], ARGV[3], 'COUNT', ARGV[6])
else
  rows = redis.call('XRANGE', base .. ARGV[1], ARGV[3], ARGV[4], 'COUNT', ARGV[6])
end
local seqs, found = {}, {}
for _, row in ipairs(rows) do
  local seq = seq_of(row[1])
  seqs[#seqs + 1] = seq
  put_record_at(found, records, seq)
end
return {seqs, found}
