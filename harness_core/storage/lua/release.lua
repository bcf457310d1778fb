-- Give a lease up. ARGV: token. Returns 1 if it was current (and is now released), else 0.
if redis.call('HGET', base .. 'lease', 'token') == ARGV[1] then
  redis.call('DEL', base .. 'lease')
  return 1
end
return 0
