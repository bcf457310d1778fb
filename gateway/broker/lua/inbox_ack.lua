-- Settle a pending item as accepted (the first settlement wins) and start its dedupe key's
-- expiry: kept until the dedupe window after the item was appended has passed.
-- KEYS: inbox, the item's dedupe key. ARGV: stream id, its dedupe key, now, dedupe window ms.
-- Returns 1 if the item was pending, 0 if it was not, -1 if its dedupe key is not the one
-- named (the caller's note of it is stale: nothing changed).
local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 0 then return 0 end
local fields, at, key = e[1][2], 0, nil
for i = 1, #fields, 2 do
  if fields[i] == 'a' then at = tonumber(fields[i + 1]) elseif fields[i] == 'k' then key = fields[i + 1] end
end
if key ~= ARGV[2] then return -1 end
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], math.max(1, at + tonumber(ARGV[4]) - tonumber(ARGV[3])))
return 1
