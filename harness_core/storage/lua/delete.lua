-- Delete every key of a session. ARGV: the caller's lease token ('' = none), now, then the names
-- of the per-lane type indexes ('<type>' and '<type>.<kind>', see type_index).
local now = clock(ARGV[2])
if redis.call('EXISTS', meta) == 0 then return 0 end
local l = redis.call('HMGET', base .. 'lease', 'owner', 'token', 'expires')
if l[1] and tonumber(l[3]) > now and l[2] ~= ARGV[1] then
  return err('lease_held', l[3] .. '\t' .. l[1])
end
local keys = {meta, base .. 'lease', base .. 'lanes', base .. 'ep', base .. 'en', base .. 'ek', base .. 'eseq',
  base .. 'rid', base .. 'log', base .. 'labels', base .. 'ctypes', base .. 'ul', base .. 'ue',
  base .. 'runs', base .. 'opens'}
for _, lane in ipairs(redis.call('HKEYS', base .. 'lanes')) do
  keys[#keys + 1] = base .. 'lr:' .. lane
  keys[#keys + 1] = base .. 'open:' .. lane
  for i = 3, #ARGV do keys[#keys + 1] = base .. 'lt:' .. ARGV[i] .. ':' .. lane end
end
for _, c in ipairs(redis.call('SMEMBERS', base .. 'ctypes')) do
  keys[#keys + 1] = base .. 'ec:' .. c
end
for i = 1, #keys, 500 do redis.call('UNLINK', unpack(keys, i, math.min(i + 499, #keys))) end
return 1
