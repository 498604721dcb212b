-- The prelude of every shard script: before each one sent as a script
-- (script.go), or once at the top of the Functions library (library.go):
-- so it only defines locals. A shard script's KEYS are one shard's keys in
-- keys.go's order (due, inflight, data, attempts, dead, errors, lease,
-- seen, done); schedule, claim and ack, which take several shards a call,
-- name every shard's keys from its key tag in ARGV. "Now" is
-- Redis TIME, so daemons with skewed clocks agree.
-- Redis does not roll back a script that fails part-way, so each is safe
-- to stop at any command: it reads first, then adds to the new place, and
-- removes from the old place last (a cut can leave an id in two indexes,
-- which Check repairs, never in none). A key of the wrong type fails a
-- script before its first write: each reads every key it writes before
-- the first write, reading only for this (ZCARD, HLEN: checkKeys) the keys
-- it would otherwise first touch after one (wrongtype_test.go breaks each
-- key of each operation). Every unpack is chunked: Lua bounds how many
-- values one unpack may yield.

-- kinds are the types of one shard's keys, by name; at their KEYS
-- positions (1..9, the order of keys.go's list).
local kinds = {due = 'zset', inflight = 'zset', data = 'hash', attempts = 'hash', dead = 'zset', errors = 'hash',
  lease = 'hash', seen = 'zset', done = 'zset'}
local at = {due = 1, inflight = 2, data = 3, attempts = 4, dead = 5, errors = 6, lease = 7, seen = 8, done = 9}
-- checkKeys reads the named keys of the shard at KEYS offset k (0): ZCARD
-- or HLEN, cheaper than TYPE, so one of the wrong type fails it here.
local function checkKeys(k, name, ...)
  if not name then return end
  if kinds[name] == 'zset' then
    redis.call('ZCARD', KEYS[k + at[name]])
  else
    redis.call('HLEN', KEYS[k + at[name]])
  end
  return checkKeys(k, ...)
end
-- chunks runs cmd key <values> in slices of at most 512 values (an even
-- number, so score/member pairs stay together).
local function chunks(cmd, key, list)
  for i = 1, #list, 512 do
    redis.call(cmd, key, unpack(list, i, math.min(i + 511, #list)))
  end
end
-- many runs a reading cmd key <ids> in chunks and joins the replies.
local function many(cmd, key, ids)
  local out = {}
  for i = 1, #ids, 512 do
    local part = redis.call(cmd, key, unpack(ids, i, math.min(i + 511, #ids)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end
local function hmget(key, ids) return many('HMGET', key, ids) end
local function nowMs()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- be6 and be4 write n as 6 or 4 bytes, big-endian: plain arithmetic and
-- one string.char, as this runs for every envelope stored.
local function be6(n)
  local f = n % 256; n = (n - f) / 256
  local e = n % 256; n = (n - e) / 256
  local d = n % 256; n = (n - d) / 256
  local c = n % 256; n = (n - c) / 256
  local b = n % 256; n = (n - b) / 256
  return string.char(n % 256, b, c, d, e, f)
end
local function be4(n)
  local d = n % 256; n = (n - d) / 256
  local c = n % 256; n = (n - c) / 256
  local b = n % 256; n = (n - b) / 256
  return string.char(n % 256, b, c, d)
end
-- stamp puts the value header (value.go) before an encoded envelope: with
-- an occurrence (> 0) for a series. mark is the format's one-shot mark
-- (its series mark is mark + 1).
local function stamp(due, occurrence, data, mark)
  if occurrence > 0 then
    return string.char(mark + 1) .. be6(due) .. be4(occurrence) .. data
  end
  return string.char(mark) .. be6(due) .. data
end
-- markOf is the one-shot mark of a stamped value's format.
local function markOf(v)
  local m = string.byte(v, 1)
  return m - (m - 240) % 2
end
-- occurrenceOf reads a series value's occurrence and where its envelope
-- starts; 0 for a one-shot.
local function occurrenceOf(v)
  if ((string.byte(v, 1) or 240) - 240) % 2 == 0 then return 0, 8 end
  local a, b, c, d = string.byte(v, 8, 11)
  return ((a * 256 + b) * 256 + c) * 256 + d, 12
end


-- attemptsOf reads an attempts value, "n" or "n/b" (keys.go): the
-- attempts counted before the current lease, and how many of them before
-- the last replay.
local function attemptsOf(v)
  local n, b = string.match(v or '', '^(%d+)/?(%d*)$')
  return tonumber(n) or 0, tonumber(b) or 0
end
-- isToken: s (a string or number) is a lease score (keys.go, inflight):
-- the claim's token, a whole number, expiry ms x 1000 + k, no multiple of
-- 1000.
local function isToken(s)
  local n = tonumber(s)
  return n ~= nil and n > 0 and n == math.floor(n) and n % 1000 ~= 0 and n < 9007199254740992
end
-- attemptsValue writes n and b as attemptsOf reads them.
local function attemptsValue(n, b)
  if b > 0 then return n .. '/' .. b end
  return n
end

-- ms writes a whole number of ms as Redis reads it: a number argument of
-- redis.call is formatted as a float (%.14g), which costs several times
-- as much.
local function ms(n) return string.format('%d', n) end
