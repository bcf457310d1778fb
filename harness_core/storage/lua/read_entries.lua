-- Point reads. ARGV: entry ids. Returns {payload, node, checksum, payload, node, checksum, ...}
-- (false if missing; the checksum is false for an entry written before checksums).
local out = {}
for i = 1, #ARGV do
  out[#out + 1] = redis.call('HGET', base .. 'ep', ARGV[i])
  out[#out + 1] = redis.call('HGET', base .. 'en', ARGV[i])
  out[#out + 1] = redis.call('HGET', base .. 'ek', ARGV[i])
end
return out
