-- Extend a current lease by its ttl. ARGV: token, now. Returns the new expiry.
local now = clock(ARGV[2])
local l = redis.call('HMGET', base .. 'lease', 'token', 'expires', 'ttl')
if l[1] ~= ARGV[1] then
  return err('lease_lost', 'writer lease ' .. ARGV[1] .. ' was superseded or released')
end
if tonumber(l[2]) <= now then
  return err('lease_lost', 'writer lease ' .. ARGV[1] .. ' expired at ' .. l[2])
end
local expires = string.format('%d', now + tonumber(l[3]))
redis.call('HSET', base .. 'lease', 'expires', expires)
return expires
