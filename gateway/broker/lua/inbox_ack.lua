-- Settle a pending item as accepted (the first settlement wins) and start its dedupe key's
-- expiry: kept until the dedupe window after the item was appended has passed.
-- KEYS: inbox, the item's dedupe key. ARGV: stream id, ms the key is kept from now.
-- Returns 1 if the item was pending.
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('PEXPIRE', KEYS[2], math.max(1, tonumber(ARGV[2])))
return 1
