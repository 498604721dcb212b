package store

// Every shard script takes the same KEYS, in this order:
//   KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] data HASH,
//   KEYS[4] claims HASH, KEYS[5] dead ZSET, KEYS[6] errors HASH
// and reads "now" from Redis TIME, so daemons with skewed clocks agree.
//
// A claim leases an id: it moves from due to inflight with the lease expiry
// as its score, plus a random fraction (k/1000 ms) that is the claim's token.
// A settle names that score, so a stale daemon whose lease expired, or
// whose envelope was replaced or cancelled meanwhile, changes nothing. Due
// scores are whole milliseconds; lease scores never are.
// The claims hash holds, as "n", how many attempts were counted before the
// current lease, for ids with n > 0 only: a first delivery writes nothing
// there. The original due time is in the data value's header (value.go).
//
// Invariants of one shard's keys (checked by Check and the model test):
//   - every data entry is in exactly one of due, inflight, dead;
//   - every due, inflight or dead member has a data entry;
//   - every inflight score has a fractional part (its claim token);
//   - claims and errors entries exist only beside data;
//   - the counted attempts n never go down, except that a replace or a
//     replay starts them over.
//
// Redis does not roll back a script that fails part-way, so every script
// is written to be safe when it stops at any command: it checks the types
// of its keys and reads first, then adds to the new place, and removes from
// the old place last. A cut between two writes can leave an id in two
// indexes (found and repaired by Check), never in none. Every unpack is
// chunked, because Lua bounds how many values one unpack may yield.

// prelude is shared by the shard scripts.
const prelude = `
local kinds = {'zset', 'zset', 'hash', 'hash', 'zset', 'hash'}
-- checkKeys fails the script before any write if a key holds the wrong
-- type (changed behind delayd's back), instead of part-way through.
local function checkKeys()
  for i = 1, #KEYS do
    local t = redis.call('TYPE', KEYS[i])['ok']
    local want = kinds[(i - 1) % 6 + 1]
    if t ~= 'none' and t ~= want then
      return 'WRONGTYPE delayd key ' .. KEYS[i] .. ' is a ' .. t .. ', not a ' .. want
    end
  end
  return nil
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
-- counted reads a claims value: the attempts counted before the current
-- lease. A value of an older version, "attempt:due:token", counted the
-- current claim too while it had a token.
local function counted(v)
  if not v then return 0 end
  local a, tok = string.match(v, '^(%d+):[^:]*:?(.*)$')
  if a then
    a = tonumber(a)
    if tok ~= '' then a = a - 1 end
    return math.max(a, 0)
  end
  return tonumber(v) or 0
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
-- an occurrence (> 0) for a series.
local function stamp(due, occurrence, data)
  if occurrence > 0 then
    return '\241' .. be6(due) .. be4(occurrence) .. data
  end
  return '\240' .. be6(due) .. data
end
-- unstamped: a value stored by a version without the value header (its
-- first byte is an envelope format, or it is empty).
local function unstamped(v)
  return (string.byte(v, 1) or 0) < 240
end
-- oldDue reads the due time from a claims value of such a version,
-- "attempt:due:token"; nil for none.
local function oldDue(c)
  return c and tonumber(string.match(c, '^%d+:(%d+)'))
end
-- occurrenceOf reads a series value's occurrence and where its envelope
-- starts; 0 for a one-shot.
local function occurrenceOf(v)
  local mark = string.byte(v, 1)
  if mark == 240 then return 0, 8 end
  if mark ~= 241 then return 0, 1 end
  local a, b, c, d = string.byte(v, 8, 11)
  return ((a * 256 + b) * 256 + c) * 256 + d, 12
end
`

// scheduleScript upserts a batch of envelopes. KEYS hold the six keys of
// each shard the batch touches, shard after shard (one shard under Redis
// Cluster, where a script must stay in one slot; any number on a single
// Redis, so a whole intake batch is one call).
// ARGV: per envelope 5 values: k (KEYS offset of its shard: 0, 6, 12...),
// id, mode, microseconds, value: with mode "d" (delay) or "e" (delay, the
// first occurrence of a series) the µs are from now and the value is the
// encoded envelope, which the script stamps with the value header; with
// mode "v" the µs are since the epoch and the value is stamped already
// (the client knows the due time, and building a string in Lua costs about
// as much as the rest of the upsert).
// Returns the due time in ms of each envelope. The due time is rounded up
// to the millisecond so that a claim at "now ms" is never early.
// A replace drops any claim in flight for the id: the older delivery may
// still go out, but its settle no longer matches a claim and changes nothing.
// Not allowed to run over maxmemory: it is what fills Redis.
var scheduleScript = newScript("", `
local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local _, nowus = nowMs()
local out = {}
for i = 1, #ARGV, 5 do
  local k = tonumber(ARGV[i])
  local id = ARGV[i+1]
  local us = tonumber(ARGV[i+3])
  local mode = ARGV[i+2]
  if mode ~= 'v' then us = nowus + us end
  local due = math.ceil(us / 1000)
  -- Adds first, then removals: a cut leaves the id indexed twice, never
  -- unindexed.
  redis.call('ZADD', KEYS[k+1], due, id)
  local v = ARGV[i+4]
  if mode == 'd' then
    v = stamp(due, 0, v)
  elseif mode == 'e' then
    v = stamp(due, 1, v)
  end
  if redis.call('HSET', KEYS[k+3], id, v) == 0 then
    -- A replace: forget any claim, error or death of the old one.
    redis.call('HDEL', KEYS[k+4], id)
    redis.call('HDEL', KEYS[k+6], id)
    redis.call('ZREM', KEYS[k+2], id)
    redis.call('ZREM', KEYS[k+5], id)
  end
  out[#out+1] = due
end
return out
`)

// cancelScript removes envelopes wherever they are: ARGV are ids.
// With ARGV[1] == "" it only removes ids found in the dead set (purge).
// Returns per id: 0 not stored, 1 removed, 2 removed while a delivery may
// already be out: it was claimed, or an earlier attempt was counted (a
// publish that failed unconfirmed may still arrive).
var cancelScript = newScript("allow-oom", `
local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local deadOnly = ARGV[1] == ''
local first = 1
if deadOnly then first = 2 end
local out, gone, seen = {}, {}, {}
for i = first, #ARGV do
  local id = ARGV[i]
  local r = 0
  if not seen[id] and redis.call('HEXISTS', KEYS[3], id) == 1 and (not deadOnly or redis.call('ZSCORE', KEYS[5], id)) then
    seen[id] = true
    r = 1
    if redis.call('ZSCORE', KEYS[2], id) or counted(redis.call('HGET', KEYS[4], id)) > 0 then r = 2 end
    gone[#gone+1] = id
  end
  out[#out+1] = r
end
-- Indexes first, data last: a cut leaves data without an index (which
-- Check reports) rather than a cancelled envelope that is still due.
if #gone > 0 then
  chunks('ZREM', KEYS[1], gone)
  chunks('ZREM', KEYS[2], gone)
  chunks('ZREM', KEYS[5], gone)
  chunks('HDEL', KEYS[4], gone)
  chunks('HDEL', KEYS[6], gone)
  chunks('HDEL', KEYS[3], gone)
end
return out
`)

// claimScript hands out up to ARGV[1] envelopes for delivery, each with a
// lease of ARGV[2] ms and the claim token ARGV[3], a fraction ".ddd" of a
// millisecond (k/1000, distinct in a double until 2200):
// first those whose lease expired (their daemon died or stalled; they are
// re-leased in place, so a backlog of due envelopes can never starve them),
// then due ones, which move from due to inflight. The expired lease was an
// attempt: it is counted in claims now.
// Returns {now µs, next due ms or -1, next lease expiry ms (rounded up) or
// -1, number of ids that had no data (removed behind delayd's back),
// number of expired leases re-claimed, the lease score (the settles'
// token), then per envelope: id, attempt, stored value}. "now" is in µs so
// the scanner can time its next wake-up to better than a millisecond.
// Allowed over maxmemory: delivering is what frees memory.
var claimScript = newScript("allow-oom", `
local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local now, nowus = nowMs()
local max = tonumber(ARGV[1])
local lease = (now + tonumber(ARGV[2])) .. ARGV[3]
local out = {nowus, -1, -1, 0, 0, lease}
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, max)
local expired = #ids
if expired < max then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, max - expired)
  for i = 1, #due do ids[#ids+1] = due[i] end
end
local fromDue = #ids - expired
if #ids > 0 then
  local datas = hmget(KEYS[3], ids)
  -- Most shards have no retries at all: then there is nothing to read.
  local prevs = {}
  if redis.call('HLEN', KEYS[4]) > 0 then prevs = hmget(KEYS[4], ids) end
  local count, leases, gone, migrate = {}, {}, {}, {}
  for j, id in ipairs(ids) do
    local data = datas[j]
    if data and unstamped(data) then
      -- Stored by a version without the value header: its due time is in
      -- its old claims value ("attempt:due:token") or its due score.
      local due = oldDue(prevs[j])
      if not due and j > expired then due = tonumber(redis.call('ZSCORE', KEYS[1], id)) end
      data = stamp(due or now, 0, data)
      migrate[#migrate+1] = id
      migrate[#migrate+1] = data
    end
    if data then
      local n = counted(prevs[j])
      if j <= expired then
        n = n + 1
        count[#count+1] = id
        count[#count+1] = n
        out[5] = out[5] + 1
      end
      leases[#leases+1] = lease
      leases[#leases+1] = id
      out[#out+1] = id
      out[#out+1] = n + 1
      out[#out+1] = data
    else
      out[4] = out[4] + 1
      if j <= expired then gone[#gone+1] = id end
    end
  end
  -- Adds first: the counts and leases. Removals last: the due ids (the
  -- fromDue lowest of the set, one command) and expired ids without data.
  if #migrate > 0 then chunks('HSET', KEYS[3], migrate) end
  if #count > 0 then chunks('HSET', KEYS[4], count) end
  if #leases > 0 then chunks('ZADD', KEYS[2], leases) end
  if fromDue > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, fromDue - 1) end
  if #gone > 0 then
    chunks('HDEL', KEYS[4], gone)
    chunks('ZREM', KEYS[2], gone)
  end
end
local nd = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nd > 0 then out[2] = tonumber(nd[2]) end
local nl = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #nl > 0 then out[3] = math.ceil(tonumber(nl[2])) end
return out
`)

// ackScript settles claimed envelopes. ARGV[1] is the retry delay in ms
// for releases, then per envelope 4 values: id, claim token (its lease
// score), op, error.
// Ops: "a" ack (delivered: delete), "r" release (back to due after the
// retry delay), "u" unreachable (like "r", but the attempt is not counted:
// nothing was written to the network), "d" dead (to the dead set), and
// "n:<due ms>" for an occurrence of a series delivered: the next
// occurrence is due then, with fresh attempts. A non-empty error is
// recorded.
// A settle whose token is not the id's current lease score is ignored: the
// id was replaced, cancelled, or re-claimed after its lease expired, and a
// stale daemon must not touch the newer claim. A settle ends the lease, so
// a resent settle changes nothing.
// Returns {now ms, number settled}.
// Allowed over maxmemory: settling is what frees memory.
var ackScript = newScript("allow-oom", `
local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local now = nowMs()
local ids = {}
for i = 2, #ARGV, 4 do ids[#ids+1] = ARGV[i] end
if #ids == 0 then return {now, 0} end
-- The ids one claim leased share its score: one exact range read per
-- token finds those still leased by it (ZMSCORE would format a double per
-- id instead). A token that is not a lease score matches nothing.
local leased = {}
local function holds(tok, id)
  local set = leased[tok]
  if not set then
    set = {}
    local n = tonumber(tok)
    if n and n == n and n ~= math.floor(n) then
      for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], tok, tok)) do set[m] = true end
    end
    leased[tok] = set
  end
  return set[id]
end
local settled, acked, errs, count, again, dead, nexts = {}, {}, {}, {}, {}, {}, {}
-- Every read comes before any write: an id settled twice in one call
-- must count once, as it would across two calls.
local done = {}
for j, id in ipairs(ids) do
  local k = 2 + (j - 1) * 4
  if not done[id] and holds(ARGV[k+1], id) then
    done[id] = true
    local op = ARGV[k+2]
    settled[#settled+1] = id
    if op == 'a' then
      acked[#acked+1] = id
    elseif string.sub(op, 1, 2) == 'n:' then
      nexts[#nexts+1] = id
      nexts[#nexts+1] = tonumber(string.sub(op, 3))
    else
      if ARGV[k+3] ~= '' then
        errs[#errs+1] = id
        errs[#errs+1] = ARGV[k+3]
      end
      if op ~= 'u' then count[#count+1] = id end
      if op == 'd' then
        dead[#dead+1] = now
        dead[#dead+1] = id
      else
        again[#again+1] = now + tonumber(ARGV[1])
        again[#again+1] = id
      end
    end
  end
end
-- Adds first (errors, counts, the new place), removals last.
if #errs > 0 then chunks('HSET', KEYS[6], errs) end
if #count > 0 then
  local prevs = hmget(KEYS[4], count)
  local counts = {}
  for j, id in ipairs(count) do
    counts[#counts+1] = id
    counts[#counts+1] = counted(prevs[j]) + 1
  end
  chunks('HSET', KEYS[4], counts)
end
if #again > 0 then chunks('ZADD', KEYS[1], again) end
if #dead > 0 then chunks('ZADD', KEYS[5], dead) end
-- A series' next occurrence: due first, then out of inflight (below),
-- then its value's header. A cut before the header is rewritten can only
-- deliver the last occurrence again, never the next one early.
local restamp = {}
for i = 1, #nexts, 2 do
  redis.call('ZADD', KEYS[1], nexts[i+1], nexts[i])
  restamp[#restamp+1] = nexts[i]
end
if #settled > 0 then chunks('ZREM', KEYS[2], settled) end
if #restamp > 0 then
  local vals = hmget(KEYS[3], restamp)
  local fresh = {}
  for j, id in ipairs(restamp) do
    local v = vals[j]
    if v then
      local occurrence, from = occurrenceOf(v)
      fresh[#fresh+1] = id
      fresh[#fresh+1] = stamp(nexts[2 * j], occurrence + 1, string.sub(v, from))
    end
  end
  if #fresh > 0 then chunks('HSET', KEYS[3], fresh) end
  chunks('HDEL', KEYS[4], restamp)
  chunks('HDEL', KEYS[6], restamp)
end
if #acked > 0 then
  -- Retries and errors are rare: skip deleting what is not there.
  if redis.call('HLEN', KEYS[4]) > 0 then chunks('HDEL', KEYS[4], acked) end
  if redis.call('HLEN', KEYS[6]) > 0 then chunks('HDEL', KEYS[6], acked) end
  chunks('HDEL', KEYS[3], acked)
end
return {now, #settled}
`)

// replayScript moves dead envelopes (ARGV: ids) back to due at once with a
// fresh attempt count. Returns {now ms, how many were dead}.
var replayScript = newScript("allow-oom", `
local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local now = nowMs()
local ids, seen = {}, {}
for _, id in ipairs(ARGV) do
  if not seen[id] and redis.call('ZSCORE', KEYS[5], id) and redis.call('HEXISTS', KEYS[3], id) == 1 then
    seen[id] = true
    ids[#ids+1] = id
  end
end
local again, migrate = {}, {}
for _, id in ipairs(ids) do
  again[#again+1] = now
  again[#again+1] = id
  -- A value stored by a version without the value header keeps its due
  -- time only in its claims value, which goes now: stamp it first.
  local v = redis.call('HGET', KEYS[3], id)
  if unstamped(v) then
    migrate[#migrate+1] = id
    migrate[#migrate+1] = stamp(oldDue(redis.call('HGET', KEYS[4], id)) or now, 0, v)
  end
end
if #ids > 0 then
  if #migrate > 0 then chunks('HSET', KEYS[3], migrate) end
  chunks('ZADD', KEYS[1], again)
  chunks('HDEL', KEYS[4], ids)
  chunks('HDEL', KEYS[6], ids)
  chunks('ZREM', KEYS[5], ids)
end
return {now, #ids}
`)

var allScripts = []*script{scheduleScript, cancelScript, claimScript, ackScript, replayScript, checkScript,
	heartbeatScript, ownScript}
