-- Become the writer. ARGV: owner, ttl ms, now ('' = server time). Returns {token, expires}.
local now = clock(ARGV[3])
local m = redis.call('HMGET', meta, 'seq', 'importing')
if not m[1] or m[2] == '1' then return err('not_found', 'session does not exist') end
local l = redis.call('HMGET', base .. 'lease', 'owner', 'expires')
if l[1] and tonumber(l[2]) > now and l[1] ~= ARGV[1] then
  return err('lease_held', l[2] .. '\t' .. l[1])
end
local token = redis.call('HINCRBY', meta, 'fence', 1)
local expires = string.format('%d', now + tonumber(ARGV[2]))
redis.call('DEL', base .. 'lease')
redis.call('HSET', base .. 'lease', 'owner', ARGV[1], 'token', token, 'ttl', ARGV[2], 'expires', expires)
return {token, expires}
