-- Point reads. ARGV: entry ids. Returns {payload, node, payload, node, ...} (false if missing).
local out = {}
for i = 1, #ARGV do
  out[#out + 1] = redis.call('HGET', base .. 'ep', ARGV[i])
  out[#out + 1] = redis.call('HGET', base .. 'en', ARGV[i])
end
return out
