-- cancel removes envelopes wherever they are (Cancel and Purge, store.go):
-- ARGV are ids. With ARGV[1] == "" it only removes ids found in the dead
-- set (purge).
-- Returns per id: 0 not stored, 1 removed, 2 removed while a delivery may
-- already be out: it was claimed, or an earlier attempt was counted (a
-- publish that failed unconfirmed may still arrive).
-- Allowed over maxmemory: cancelling frees memory.
local due, inflight, data, attempts, dead, errors = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

local deadOnly = ARGV[1] == ''
local first = 1
if deadOnly then first = 2 end
local out, gone, found = {}, {}, {}
for i = first, #ARGV do
  local id = ARGV[i]
  local r = 0
  if not found[id] and redis.call('HEXISTS', data, id) == 1 and (not deadOnly or redis.call('ZSCORE', dead, id)) then
    found[id] = true
    r = 1
    if redis.call('ZSCORE', inflight, id) or attemptsOf(redis.call('HGET', attempts, id)) > 0 then r = 2 end
    gone[#gone+1] = id
  end
  out[#out+1] = r
end
-- Indexes first, data last: a cut leaves data without an index (which
-- Check reports) rather than a cancelled envelope that is still due.
if #gone > 0 then
  -- data and inflight were read (and dead by a purge); the others may
  -- only be written.
  checkKeys(0, 'due', 'attempts', 'dead', 'errors')
  chunks('ZREM', due, gone)
  chunks('ZREM', inflight, gone)
  chunks('ZREM', dead, gone)
  chunks('HDEL', attempts, gone)
  chunks('HDEL', errors, gone)
  chunks('HDEL', data, gone)
end
return out
