-- Become the writer. ARGV: owner, ttl ms, now ('' = server time). Returns {token, expires}.
local now = clock(ARGV[3])
local m = redis.call('HMGET', meta, 'seq', 'importing')
if not m[1] or m[2] == '1' then return err('not_found', 'session does not exist') end
local l = redis.call('HMGET', base .. 'lease', 'owner', 'expires')
if l[1] and tonumber(l[2]) > now and l[1] ~= ARGV[1] then
  return err('lease_held', l[2] .. '\t' .. l[1])
end
-- The next token, and at least the server's time in microseconds: a Redis that lost its writes
-- (no persistence, an older AOF or snapshot, a replica that lagged) counts again from an older
-- fence, and a writer from before the loss must not find its own token handed out again.
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local token = redis.call('HINCRBY', meta, 'fence', 1)
if token < floor then
  token = floor
  redis.call('HSET', meta, 'fence', string.format('%d', token))
end
token = string.format('%d', token)  -- as text: Lua writes a number this large as 1.78e+15
local expires = string.format('%d', now + tonumber(ARGV[2]))
redis.call('DEL', base .. 'lease')
redis.call('HSET', base .. 'lease', 'owner', ARGV[1], 'token', token, 'ttl', ARGV[2], 'expires', expires)
return {token, expires}
