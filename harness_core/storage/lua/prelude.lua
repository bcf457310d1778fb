-- Shared by every script: KEYS[1] is the session's meta key; the other keys share its hash tag.
local meta = KEYS[1]
local base = string.sub(meta, 1, #meta - 4)
local function err(code, msg) return redis.error_reply('GW ' .. code .. ' ' .. msg) end
local function clock(arg)
  local now = tonumber(arg)
  if now then return now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The session layout these scripts keep (meta field 'layout'); older sessions are upgraded.
local LAYOUT = '3'
-- A usage amount: 5 token counts, then 5 cost amounts (input, output, cache read, cache write,
-- total). Token sums stay within +-(2^53 - 1), where doubles are exact; cost sums stay finite.
local MAX_TOKENS = 9007199254740991
local function usage_zero() return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0} end
local function usage_unpack(packed)
  if not packed then return usage_zero() end
  local out = {}
  for v in string.gmatch(packed, '%S+') do out[#out + 1] = tonumber(v) end
  return out
end
-- sums + amounts, or nil if a sum leaves its range
local function usage_add(sums, amounts)
  local out = {}
  for i = 1, 10 do
    local v = sums[i] + amounts[i]
    if i <= 5 then
      if v > MAX_TOKENS or v < -MAX_TOKENS then return nil end
    elseif v ~= v or v == math.huge or v == -math.huge then
      return nil
    end
    out[i] = v
  end
  return out
end
-- token counts as integers, costs as exact doubles that read back bit for bit (%.17g)
local function usage_format(i, v)
  if i <= 5 then return string.format('%d', v) end
  return string.format('%.17g', v)
end
local function usage_pack(sums)
  local parts = {}
  for i = 1, 10 do parts[i] = usage_format(i, sums[i]) end
  return table.concat(parts, ' ')
end
local USAGE_FIELDS = {'u_input', 'u_output', 'u_cache_read', 'u_cache_write', 'u_total_tokens',
  'c_input', 'c_output', 'c_cache_read', 'c_cache_write', 'c_total'}
-- The stream listing a lane's records of one type (and operation kind): stream id = seq.
local function type_index(rtype, kind, lane)
  if kind and kind ~= '' then return base .. 'lt:' .. rtype .. '.' .. kind .. ':' .. lane end
  return base .. 'lt:' .. rtype .. ':' .. lane
end
-- A member of the 'runs' index (one sorted set, all scores 0, read by lex range): a run's
-- records sort together, in seq order. Ids and lanes hold no tab.
local function run_member(run, seq, lane) return string.format('%s\t%016d\t%s', run, seq, lane) end
-- Stream ids are '<seq>-0'. Records reach the caller as flat {seq, timestamp, payload, checksum}
-- quadruples (checksum false for a record written before checksums).
local function seq_of(stream_id) return string.match(stream_id, '^(%d+)') end
local function put_record(out, row)
  local fields, t, d, crc = row[2], false, false, false
  for i = 1, #fields, 2 do
    local name = fields[i]
    if name == 't' then t = fields[i + 1]
    elseif name == 'd' then d = fields[i + 1]
    elseif name == 'crc' then crc = fields[i + 1] end
  end
  out[#out + 1] = seq_of(row[1])
  out[#out + 1] = t
  out[#out + 1] = d
  out[#out + 1] = crc
end
local function put_record_at(out, records, seq)
  local rows = redis.call('XRANGE', records, seq .. '-0', seq .. '-0')
  if rows[1] then put_record(out, rows[1]) end
end
