-- Create a session. ARGV: id, created_at, parent_session_id ('' = none), metadata json,
-- importing ('1' keeps the session invisible until the import finishes).
if redis.call('EXISTS', meta) == 1 then
  return err('already_exists', 'session ' .. ARGV[1] .. ' already exists')
end
redis.call('HSET', meta, 'id', ARGV[1], 'created_at', ARGV[2], 'parent', ARGV[3], 'metadata', ARGV[4],
  'seq', 0, 'fence', 0, 'n_entries', 0, 'n_messages', 0, 'n_records', 0,
  'u_input', 0, 'u_output', 0, 'u_cache_read', 0, 'u_cache_write', 0, 'u_total_tokens', 0,
  'c_input', '0', 'c_output', '0', 'c_cache_read', '0', 'c_cache_write', '0', 'c_total', '0',
  'layout', LAYOUT)
if ARGV[5] == '1' then redis.call('HSET', meta, 'importing', '1') end
redis.call('HSET', base .. 'lanes', 'main', '')
return 1
