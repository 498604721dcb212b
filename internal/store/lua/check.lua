-- check checks one page of one shard against the invariants of keys.go
-- (Check, check.go), atomically, so it is safe while daemons deliver:
-- every script keeps the invariants within one call, and this sees each id
-- between calls.
-- ARGV[1] phase: "data" (scan data: each id indexed exactly once), the
-- name of a set or hash whose members must have data (due, inflight,
-- dead, attempts, errors); ARGV[2] the SCAN
-- cursor; ARGV[3] the page size; ARGV[4] "1" to repair what it finds.
-- Repairs: data without an index is due now (delivered rather than lost);
-- an id in several indexes keeps the first of inflight, due, dead; index,
-- attempts and errors entries without data are dropped.
-- Returns {next cursor, then kind, count pairs}.
-- Allowed over maxmemory.
local due, inflight, data, attempts, dead, errors = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

-- members: per phase, its key, the key's type and the kind of what it
-- finds (the kind of an attempts entry without data keeps an older name).
local members = {
  due = {due, 'zset', 'due_without_data'},
  inflight = {inflight, 'zset', 'inflight_without_data'},
  dead = {dead, 'zset', 'dead_without_data'},
  attempts = {attempts, 'hash', 'claim_without_data'},
  errors = {errors, 'hash', 'error_without_data'},
}

-- Every key is checked: check is no hot path, and its repairs follow
-- reads of other ids.
checkKeys(0, 'due', 'inflight', 'data', 'attempts', 'dead', 'errors', 'lease', 'seen', 'done')
local now = nowMs()
local phase, repair = ARGV[1], ARGV[4] == '1'
local found = {}
local function add(kind, n) found[kind] = (found[kind] or 0) + n end
local out
if phase == 'data' then
  local r = redis.call('HSCAN', data, ARGV[2], 'COUNT', tonumber(ARGV[3]))
  out = {r[1]}
  for i = 1, #r[2], 2 do
    local id = r[2][i]
    local inf = redis.call('ZSCORE', inflight, id)
    local due_ = redis.call('ZSCORE', due, id)
    local gone = redis.call('ZSCORE', dead, id)
    local n = (inf and 1 or 0) + (due_ and 1 or 0) + (gone and 1 or 0)
    if n == 0 then
      add('unindexed_data', 1)
      if repair then redis.call('ZADD', due, now, id) end
    elseif n > 1 then
      add('multiply_indexed', 1)
      if repair then
        if inf then redis.call('ZREM', due, id) end
        if inf or due_ then redis.call('ZREM', dead, id) end
      end
    end
    if inf and not isToken(inf) then
      -- A lease score that is no token: settles cannot match it, and the
      -- next claim re-leases it: report only.
      add('inflight_without_claim', 1)
    end
  end
else
  local m = members[phase]
  if not m then return redis.error_reply('ERR delayd check: unknown phase ' .. phase) end
  local key, kind, name = m[1], m[2], m[3]
  local r
  if kind == 'zset' then
    r = redis.call('ZSCAN', key, ARGV[2], 'COUNT', tonumber(ARGV[3]))
  else
    r = redis.call('HSCAN', key, ARGV[2], 'COUNT', tonumber(ARGV[3]))
  end
  out = {r[1]}
  for i = 1, #r[2], 2 do
    local id = r[2][i]
    if redis.call('HEXISTS', data, id) == 0 then
      add(name, 1)
      if repair then
        if kind == 'zset' then redis.call('ZREM', key, id) else redis.call('HDEL', key, id) end
      end
    end
  end
end
for kind, n in pairs(found) do
  out[#out+1] = kind
  out[#out+1] = n
end
return out
