-- replay moves dead envelopes (ARGV: ids) back to due at once (Replay,
-- store.go). The attempts counted so far stay, so the next delivery
-- carries the next attempt number, and all of them now count before the
-- replay: the envelope gets a fresh budget of tries. Returns {now ms, how
-- many were dead}.
-- Allowed over maxmemory.
local due, data, attempts, dead, errors = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

local now = nowMs()
local ids, found = {}, {}
for _, id in ipairs(ARGV) do
  if not found[id] and redis.call('ZSCORE', dead, id) and redis.call('HEXISTS', data, id) == 1 then
    found[id] = true
    ids[#ids+1] = id
  end
end
local again, budget, none = {}, {}, {}
for _, id in ipairs(ids) do
  again[#again+1] = now
  again[#again+1] = id
  local a = redis.call('HGET', attempts, id)
  local n = attemptsOf(a)
  if n > 0 then
    budget[#budget+1] = id
    budget[#budget+1] = attemptsValue(n, n)
  elseif a then
    none[#none+1] = id
  end
end
if #ids > 0 then
  -- dead, data and attempts were read; due and errors are only written.
  checkKeys(0, 'due', 'errors')
  if #budget > 0 then chunks('HSET', attempts, budget) end
  chunks('ZADD', due, again)
  if #none > 0 then chunks('HDEL', attempts, none) end
  chunks('HDEL', errors, ids)
  chunks('ZREM', dead, ids)
end
return {now, #ids}
