-- A path walk. ARGV: start id, max steps. Returns {id, node, id, node, ...} toward the root.
local out = {}
local id = ARGV[1]
for i = 1, tonumber(ARGV[2]) do
  local node = redis.call('HGET', base .. 'en', id)
  if not node then
    if i == 1 then return err('not_found', 'entry ' .. id .. ' does not exist') end
    break
  end
  out[#out + 1] = id
  out[#out + 1] = node
  local _, _, parent = string.match(node, '^([^\t]*)\t([^\t]*)\t([^\t]*)')
  if parent == '' then break end
  id = parent
end
return out
