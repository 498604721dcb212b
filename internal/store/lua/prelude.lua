-- The prelude of every shard script: script.go puts it before each one
-- sent as a script, and library.go at the top of the Functions library,
-- where it runs once, when the library loads: so it only defines locals.
-- A shard script's KEYS are one shard's keys in the order of keys.go
-- (shardKeys.list): due, inflight, data, attempts, dead, errors, lease,
-- seen, done, pending; the schedule script takes several shards' keys, one shard after
-- the other. Each script names the keys it uses on its first lines, and
-- reads "now" from Redis TIME, so daemons with skewed clocks agree.
--
-- Redis does not roll back a script that fails part-way, so every script
-- is written to be safe when it stops at any command: it reads first,
-- then adds to the new place, and removes from the old place last. A cut
-- between two writes can leave an id in two indexes (found and repaired by
-- Check), never in none. Every unpack is chunked, because Lua bounds how
-- many values one unpack may yield.
--
-- A key changed to a wrong type behind delayd's back fails a script before
-- its first write, never part-way. A read of such a key fails by itself
-- (Redis' WRONGTYPE, before anything is written; the store then names the
-- key, script.go), and so does the first write. So a script reads every
-- key it touches before its first write where it reads it anyway, and
-- reads only for this (checkKeys) the keys it would otherwise first touch
-- after a write: checking every key of every call was a fifth of Redis'
-- work per claim and ack of 4 envelopes a shard, and half of a schedule's
-- (docs/BENCHMARKS.md). wrongtype_test.go breaks each key of each
-- operation in turn, and finds a write moved before a read.

-- kinds are the types of one shard's keys, by name; at their KEYS
-- positions (1..10, the order of keys.go's list).
local kinds = {due = 'zset', inflight = 'zset', data = 'hash', attempts = 'hash', dead = 'zset', errors = 'hash',
  lease = 'hash', seen = 'zset', done = 'zset', pending = 'zset'}
local at = {due = 1, inflight = 2, data = 3, attempts = 4, dead = 5, errors = 6, lease = 7, seen = 8, done = 9,
  pending = 10}
-- checkKeys reads the named keys of the shard at KEYS offset k (0, 10,
-- 20...): ZCARD or HLEN, cheaper than TYPE, so one of the wrong type
-- fails the script here.
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

-- ======== Due buckets (format 4, keys.go: pending) ======================
-- The pending envelopes scheduled since the fleet writes format 4 are
-- indexed in small sorted sets, the buckets (id → due ms, a listpack while
-- at most 128 entries of at most 64 bytes), instead of one entry each in
-- the due set's hash table and skiplist. The shard's pending key is the
-- index of its buckets: ZSET "<bound>" → bound, the due ms a bucket starts
-- at; the bucket's key is the pending key, ":", and its bound. Buckets
-- split time into ranges: a bucket holds the entries due from its bound
-- up to the next bucket's (the first one moves its bound down when an
-- entry comes in below it). So an entry's bucket follows from its due
-- time, which its value header keeps. A bucket splits past bucketMax
-- entries, at a due time, never inside one millisecond: the ids due in
-- one ms stay together, and more than 128 of them in one shard make their
-- bucket a skiplist (correct, only as large as the due set). The buckets'
-- keys are not in KEYS: they are named after the shard's pending key, in
-- its hash tag's slot (docs/architecture.md says why). The count of their
-- entries is kept in the pending key's "#" key, for Stats.
-- The due set keeps what older daemons wrote, and what goes pending again
-- at a time other than its header's (retry, postpone, replay, a series'
-- next occurrence, a newer format given back): every script reads both.
local bucketMax = 120
-- before: a < b bytewise, as Redis orders members (Lua's < follows the
-- locale).
local function before(a, b)
  if a == b then return false end
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
-- ms writes a whole number of ms as Redis reads it: a number argument of
-- redis.call is formatted as a float (%.14g), which costs several times
-- as much.
local function ms(n) return string.format('%d', n) end
-- bucketOf returns the bucket (its bound, the index member) whose range
-- holds due, nil when there is no bucket, and true when due is below
-- every bucket (the bucket is then the first).
local function bucketOf(index, due)
  local r = redis.call('ZREVRANGEBYSCORE', index, ms(due), '-inf', 'LIMIT', '0', '1')
  if #r == 0 then return redis.call('ZRANGE', index, '0', '0')[1], true end
  return r[1], false
end
-- counts: per pending key, entries added (+) or removed (-) by this call
-- (tally); countBuckets writes them (last: a cut leaves the count off,
-- which Check repairs). New at every call: a script's run of the prelude
-- makes it, and each function of the library (library.go) when it starts.
local counts = {}
local function tally(index, n)
  if n ~= 0 then counts[index] = (counts[index] or 0) + n end
end
local function countBuckets()
  for index, n in pairs(counts) do
    if n ~= 0 then redis.call('INCRBY', index .. '#', n) end
  end
  counts = {}
end
-- bucketAdd puts id, due at due, in its bucket, and returns the bucket.
-- Below every bucket, the first one is renamed to start there (so every
-- bucket's entries are at or above its bound); with none, the first one
-- starts there.
local function bucketAdd(index, due, id)
  local m, below = bucketOf(index, due)
  local d = ms(due)
  if not m or below then
    local nm = d
    redis.call('ZADD', index, nm, nm)
    if m then
      if redis.call('EXISTS', index .. ':' .. m) == 1 then
        redis.call('RENAME', index .. ':' .. m, index .. ':' .. nm)
      end
      redis.call('ZREM', index, m)
    end
    m = nm
  end
  tally(index, redis.call('ZADD', index .. ':' .. m, d, id))
  return m
end
-- bucketSplit moves the later part of bucket m to a new bucket once it
-- holds more than bucketMax entries: from the due time of its median
-- entry, or of id when id, just added, is its last entry (envelopes
-- scheduled with one delay come in due order, and would otherwise leave
-- every bucket half full); past the first due time if that is the
-- median's. A bucket of one due time does not split. New bucket first,
-- then out of the old one.
local function bucketSplit(index, m, id)
  local key = index .. ':' .. m
  local n = redis.call('ZCARD', key)
  if n <= bucketMax then return end
  local first = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
  local last = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  if first[2] == last[2] then return end
  local cut
  if last[1] == id then
    cut = tonumber(last[2])
  else
    local half = math.floor(n / 2)
    cut = tonumber(redis.call('ZRANGE', key, half, half, 'WITHSCORES')[2])
  end
  if cut == tonumber(first[2]) then
    cut = tonumber(redis.call('ZRANGEBYSCORE', key, '(' .. ms(cut), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2])
  end
  local top = redis.call('ZRANGEBYSCORE', key, ms(cut), '+inf', 'WITHSCORES')
  local moved = {}
  for i = 1, #top, 2 do
    moved[#moved+1] = top[i+1]
    moved[#moved+1] = top[i]
  end
  local nm = ms(cut)
  redis.call('ZADD', index, nm, nm)
  chunks('ZADD', index .. ':' .. nm, moved)
  redis.call('ZREMRANGEBYSCORE', key, nm, '+inf')
end
-- bucketRemove removes ids from bucket m, and the bucket from the index
-- once it is empty.
local function bucketRemove(index, m, ids)
  local key = index .. ':' .. m
  for i = 1, #ids, 512 do
    tally(index, -redis.call('ZREM', key, unpack(ids, i, math.min(i + 511, #ids))))
  end
  if redis.call('EXISTS', key) == 0 then redis.call('ZREM', index, m) end
end
-- headerDue is the due time in a stamped value's header, nil for none.
local function headerDue(v)
  if not v or #v < 7 or string.byte(v, 1) < 240 then return nil end
  local a, b, c, d, e, f = string.byte(v, 2, 7)
  return ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
end
-- bucketed returns the bucket holding id, whose stored value is v, or nil
-- when it is in none.
local function bucketed(index, v, id)
  local due = headerDue(v)
  if not due then return nil end
  local m = bucketOf(index, due)
  if m and redis.call('ZSCORE', index .. ':' .. m, id) then return m end
  return nil
end
-- ======== End of due buckets ============================================
