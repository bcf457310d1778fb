-- Compare-and-set one mark. KEYS: marks. ARGV: name, value, expected, whether one is expected
-- ("0": the mark must be unset). Returns 1 if it was set.
local current = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[4] == '0' then
  if current then return 0 end
elseif current ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
