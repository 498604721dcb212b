-- release puts held envelopes of one shard back in due order (Resume and
-- RemoveLimit, flow.go). KEYS: the shard's due and inflight sets. ARGV:
-- triples of id, the due score it was held at (as the hold wrote it), and
-- the score to give it. An id whose due score is not the one it was held
-- at was meanwhile cancelled, replaced or delivered: it is left as it is.
-- One in flight may be on its way to being held (listed before its hold
-- is written): the caller keeps it listed, to release once held.
-- An id may be listed more than once (parked again by a daemon that had
-- not seen a resume): it is moved once. Returns per id: 1 moved, 0 left
-- as it is, 2 in flight.
-- Allowed over maxmemory.
local due, inflight = KEYS[1], KEYS[2]
local ids = {}
for i = 1, #ARGV, 3 do ids[#ids+1] = ARGV[i] end
local have, out, moves, moved = {}, {}, {}, {}
for i = 1, #ids, 512 do
  local part = redis.call('ZMSCORE', due, unpack(ids, i, math.min(i + 511, #ids)))
  for j = 1, #part do have[#have+1] = part[j] end
end
for j, id in ipairs(ids) do
  local a = 3 * j - 2
  out[j] = 0
  if moved[id] then
    -- Listed twice (parked twice): moved once.
  elseif have[j] and tonumber(have[j]) == tonumber(ARGV[a+1]) then
    moves[#moves+1] = ARGV[a+2]
    moves[#moves+1] = id
    moved[id] = true
    out[j] = 1
  elseif not have[j] and redis.call('ZSCORE', inflight, id) then
    out[j] = 2
  end
end
for i = 1, #moves, 512 do redis.call('ZADD', due, 'XX', unpack(moves, i, math.min(i + 511, #moves))) end
return out
