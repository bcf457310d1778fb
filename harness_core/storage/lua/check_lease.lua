-- Is a lease current? ARGV: token, now. Returns its expiry, or a lease_lost error.
local now = clock(ARGV[2])
local l = redis.call('HMGET', base .. 'lease', 'token', 'expires')
if l[1] ~= ARGV[1] then
  return err('lease_lost', 'writer lease ' .. ARGV[1] .. ' was superseded or released')
end
if tonumber(l[2]) <= now then
  return err('lease_lost', 'writer lease ' .. ARGV[1] .. ' expired at ' .. l[2])
end
return l[2]
