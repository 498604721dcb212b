package store

// Every shard script takes the same KEYS, in this order:
//   KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] data HASH,
//   KEYS[4] claims HASH (attempts in Go), KEYS[5] dead ZSET,
//   KEYS[6] errors HASH, KEYS[7] lease HASH, KEYS[8] seen ZSET
// and reads "now" from Redis TIME, so daemons with skewed clocks agree.
//
// A claim leases an id: it moves from due to inflight with the lease expiry
// as its score, plus a fraction (k/1000 ms) that makes the score the
// claim's token. A settle names that score, so a stale daemon whose lease
// expired, or whose envelope was replaced or cancelled meanwhile, changes
// nothing. Due scores are whole milliseconds; lease scores never are.
// Tokens never repeat within a shard, so two claims of one id can never
// share one, however close in time (a replace and its re-claim within one
// millisecond). As an integer, a token is expiry ms × 1000 + k. The lease
// hash keeps, per lease length in use, a class (the token's residue mod
// 8) and the newest token handed out: each claim takes a token of its
// class above the newest of the class, and lengths of different classes
// cannot meet. Tokens of one length grow with time; those of two lengths
// could end in the same millisecond, which the classes keep apart. With
// more than 8 lengths in use at once (daemons configured differently),
// two share a class, and a shorter lease may then end as late as the
// longer one: late, never early.
// The claims hash holds, as "n" or "n/b", how many attempts were counted
// before the current lease (n), and how many of them before the last
// replay (b, only when > 0), for ids with n > 0 only: a first delivery
// writes nothing there. An envelope's attempt number is n + 1 and only
// goes up; a replay grants a fresh budget of tries by setting b = n. The
// original due time is in the data value's header (value.go).
//
// Invariants of one shard's keys (checked by Check and the model test):
//   - every data entry is in exactly one of due, inflight, dead;
//   - every due, inflight or dead member has a data entry;
//   - every inflight score has a fractional part (its claim token);
//   - claims and errors entries exist only beside data;
//   - the counted attempts n never go down, except that a replace starts
//     them over (a new version), and b <= n;
//   - no two claims of a shard ever had the same token (lease key).
//
// Redis does not roll back a script that fails part-way, so every script
// is written to be safe when it stops at any command: it checks the types
// of its keys and reads first, then adds to the new place, and removes from
// the old place last. A cut between two writes can leave an id in two
// indexes (found and repaired by Check), never in none. Every unpack is
// chunked, because Lua bounds how many values one unpack may yield.

// prelude is shared by the shard scripts.
const prelude = `
local kinds = {'zset', 'zset', 'hash', 'hash', 'zset', 'hash', 'hash', 'zset'}
-- checkKeys fails the script before any write if a key holds the wrong
-- type (changed behind delayd's back), instead of part-way through.
local function checkKeys()
  for i = 1, #KEYS do
    local t = redis.call('TYPE', KEYS[i])['ok']
    local want = kinds[(i - 1) % 8 + 1]
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
-- claimsOf reads a claims value, "n" or "n/b": the attempts counted
-- before the current lease, and how many of them before the last replay.
-- A value of an older version, "attempt:due:token", counted the current
-- claim too while it had a token.
local function claimsOf(v)
  if not v then return 0, 0 end
  local n, b = string.match(v, '^(%d+)/(%d+)$')
  if n then return tonumber(n), tonumber(b) end
  local a, tok = string.match(v, '^(%d+):[^:]*:?(.*)$')
  if a then
    a = tonumber(a)
    if tok ~= '' then a = a - 1 end
    return math.max(a, 0), 0
  end
  return tonumber(v) or 0, 0
end
local function counted(v)
  local n = claimsOf(v)
  return n
end
-- claimsValue writes n and b as claimsOf reads them.
local function claimsValue(n, b)
  if b > 0 then return n .. '/' .. b end
  return n
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
-- (its series mark is mark + 1); the default is format 2's.
local function stamp(due, occurrence, data, mark)
  if occurrence > 0 then
    return string.char((mark or 240) + 1) .. be6(due) .. be4(occurrence) .. data
  end
  return string.char(mark or 240) .. be6(due) .. data
end
-- markOf is the one-shot mark of a stamped value's format.
local function markOf(v)
  local m = string.byte(v, 1)
  return m - (m - 240) % 2
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
  local mark = string.byte(v, 1) or 0
  if mark < 240 then return 0, 1 end
  if (mark - 240) % 2 == 0 then return 0, 8 end
  local a, b, c, d = string.byte(v, 8, 11)
  return ((a * 256 + b) * 256 + c) * 256 + d, 12
end
`

// scheduleScript upserts a batch of envelopes. KEYS hold the 8 keys of
// each shard the batch touches, shard after shard (one shard under Redis
// Cluster, where a script must stay in one slot; any number on a single
// Redis, so a whole intake batch is one call).
// ARGV[1] is the one-shot mark of the value format to write (value.go),
// ARGV[2] how long to remember a stream message (ms), then per envelope 6
// values: k (KEYS offset of its shard: 0, 8, 16...), id, mode,
// microseconds, value, stream message ("" for none): with mode "d" (delay)
// or "e" (delay, the first occurrence of a series) the µs are from now and
// the value is the encoded envelope, which the script stamps with the
// value header; with mode "v" the µs are since the epoch and the value is
// stamped already (the client knows the due time, and building a string in
// Lua costs about as much as the rest of the upsert).
// Returns the due time in ms of each envelope, or 0 for a stream message
// this shard stored already (a redelivery after a lost ack: storing it
// again would deliver it twice, or bring back an older version). The due
// time is rounded up to the millisecond so that a claim at "now ms" is
// never early.
// A replace drops any claim in flight for the id: the older delivery may
// still go out, but its settle no longer matches a claim and changes nothing.
// Not allowed to run over maxmemory: it is what fills Redis.
var scheduleScript = newScript("", `
local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local _, nowus = nowMs()
local nowms = math.floor(nowus / 1000)
local mark, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local out, pruned = {}, {}
for i = 3, #ARGV, 6 do
  local k = tonumber(ARGV[i])
  local id = ARGV[i+1]
  local msg = ARGV[i+5]
  local again = false
  if msg ~= '' then
    if not pruned[k] then
      redis.call('ZREMRANGEBYSCORE', KEYS[k+8], '-inf', nowms)
      pruned[k] = true
    end
    again = redis.call('ZSCORE', KEYS[k+8], msg)
  end
  if again then
    out[#out+1] = 0
  else
    local us = tonumber(ARGV[i+3])
    local mode = ARGV[i+2]
    if mode ~= 'v' then us = nowus + us end
    -- At least 1: 0 means "stored already" in the reply.
    local due = math.max(math.ceil(us / 1000), 1)
    -- Adds first, then removals: a cut leaves the id indexed twice, never
    -- unindexed.
    redis.call('ZADD', KEYS[k+1], due, id)
    local v = ARGV[i+4]
    if mode == 'd' then
      v = stamp(due, 0, v, mark)
    elseif mode == 'e' then
      v = stamp(due, 1, v, mark)
    end
    if redis.call('HSET', KEYS[k+3], id, v) == 0 then
      -- A replace: forget any claim, error or death of the old one.
      redis.call('HDEL', KEYS[k+4], id)
      redis.call('HDEL', KEYS[k+6], id)
      redis.call('ZREM', KEYS[k+2], id)
      redis.call('ZREM', KEYS[k+5], id)
    end
    -- Remembered last: a cut before it stores the message again on
    -- redelivery, which redoes the replace's removals too.
    if msg ~= '' then redis.call('ZADD', KEYS[k+8], nowms + window, msg) end
    out[#out+1] = due
  end
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

// leaseToken takes the token of a claim at now with a lease of length ms
// (a string) and hint k (1..991): see the top of this file. It is written
// first: a cut after it only skips a token.
const leaseTokenLua = `
local function leaseToken(now, length, k)
  local h = redis.call('HGETALL', KEYS[7])
  local top, mine = {}, nil
  for i = 1, #h, 2 do
    local c, t = string.match(h[i+1], '^(%d):(%d+)$')
    c, t = tonumber(c), tonumber(t)
    if c and t >= now * 1000 then
      top[c] = math.max(top[c] or 0, t)
      if h[i] == length then mine = c end
    else
      -- Ended: every token it handed out is below any new one.
      redis.call('HDEL', KEYS[7], h[i])
    end
  end
  if not mine then
    for c = 0, 7 do
      if not top[c] then mine = c break end
      if not mine or top[c] < top[mine] then mine = c end
    end
  end
  local t = (now + tonumber(length)) * 1000 + k
  t = t + (mine - t % 8) % 8
  if t <= (top[mine] or 0) then t = top[mine] + 8 end
  if t % 1000 == 0 then t = t + 8 end
  redis.call('HSET', KEYS[7], length, mine .. ':' .. string.format('%d', t))
  return string.format('%d.%03d', (t - t % 1000) / 1000, t % 1000)
end
`

// claimScript hands out up to ARGV[1] envelopes for delivery, each with a
// lease of ARGV[2] ms: first those whose lease expired (their daemon died
// or stalled; they are re-leased in place, so a backlog of due envelopes
// can never starve them), then due ones, which move from due to inflight.
// The expired lease was an attempt: it is counted in claims now.
// The lease score is the claim's token: the expiry plus about k/1000 ms,
// k = ARGV[3] (1..991), unique in the shard (leaseToken).
// ARGV[5] bounds the bytes of stored values handed out (0: no bound):
// envelopes are added while they fit in it; with ARGV[6] "1" the first is
// handed out even if it alone is larger (so one over-large envelope can
// never stall its shard; the caller grants that to one shard per claim,
// so a claim holds at most its bound plus one payload). The values are
// read 16 at a time, so Redis holds little more than the bound either. ARGV[4] is the newest value format this daemon reads, as
// its series mark: a value of a newer format (a newer daemon wrote it) is not handed
// out, nor rewritten or counted: it is given back, due again in a second,
// for a daemon that knows its format.
// Returns {now µs, next due ms or -1, next lease expiry ms (rounded up) or
// -1, number of ids that had no data (removed behind delayd's back),
// number of expired leases re-claimed, the lease score (the settles'
// token), number of values of an unknown format given back, the newest
// such mark (0 for none), then per envelope: id, attempt, stored value}.
// The attempt is n + 1, or "n+1/b" when b > 0 (claims hash, above). "now"
// is in µs so the scanner can time its next wake-up to better than a
// millisecond.
// Allowed over maxmemory: delivering is what frees memory.
var claimScript = newScript("allow-oom", leaseTokenLua+`
local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local now, nowus = nowMs()
local max = tonumber(ARGV[1])
local known = tonumber(ARGV[4])
local out = {nowus, -1, -1, 0, 0, '', 0, 0}
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, max)
local expired = #ids
if expired < max then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, max - expired)
  for i = 1, #due do ids[#ids+1] = due[i] end
end
local datas
local budget = tonumber(ARGV[5]) or 0
if budget > 0 and #ids > 0 then
  datas = {}
  local bytes, full = 0, false
  local oversize = ARGV[6] == '1'
  for i = 1, #ids, 16 do
    local part = redis.call('HMGET', KEYS[3], unpack(ids, i, math.min(i + 15, #ids)))
    for j = 1, #part do
      local size = part[j] and #part[j] or 0
      if bytes + size > budget and (#datas > 0 or not oversize) then
        full = true
        break
      end
      datas[#datas+1] = part[j]
      bytes = bytes + size
    end
    if full then break end
  end
  -- The rest stays where it is: due, or an expired lease claimed next time.
  for k = #ids, #datas + 1, -1 do ids[k] = nil end
  expired = math.min(expired, #ids)
end
local fromDue = #ids - expired
if #ids > 0 then
  local lease = leaseToken(now, ARGV[2], tonumber(ARGV[3]))
  out[6] = lease
  datas = datas or hmget(KEYS[3], ids)
  -- Most shards have no retries at all: then there is nothing to read.
  local prevs = {}
  if redis.call('HLEN', KEYS[4]) > 0 then prevs = hmget(KEYS[4], ids) end
  local count, leases, gone, migrate, later, unleased, taken = {}, {}, {}, {}, {}, {}, {}
  for j, id in ipairs(ids) do
    local data = datas[j]
    local m = data and string.byte(data, 1) or 0
    if m > known then
      -- A format this daemon cannot read: leave it as it is.
      out[7] = out[7] + 1
      out[8] = math.max(out[8], m - (m - 240) % 2)
      later[#later+1] = now + 1000
      later[#later+1] = id
      if j <= expired then unleased[#unleased+1] = id end
    else
      if j > expired then taken[#taken+1] = id end
      if data and m < 240 then
        -- Stored by a version without the value header: its due time is
        -- in its old claims value ("attempt:due:token") or its due score.
        local due = oldDue(prevs[j])
        if not due and j > expired then due = tonumber(redis.call('ZSCORE', KEYS[1], id)) end
        data = stamp(due or now, 0, data)
        migrate[#migrate+1] = id
        migrate[#migrate+1] = data
      end
      if data then
        local n, b = claimsOf(prevs[j])
        if j <= expired then
          n = n + 1
          count[#count+1] = id
          count[#count+1] = claimsValue(n, b)
          out[5] = out[5] + 1
        end
        leases[#leases+1] = lease
        leases[#leases+1] = id
        out[#out+1] = id
        out[#out+1] = claimsValue(n + 1, b)
        out[#out+1] = data
      else
        out[4] = out[4] + 1
        if j <= expired then gone[#gone+1] = id end
      end
    end
  end
  -- Adds first: the counts and leases, unknown formats due again. Removals
  -- last: the due ids (the fromDue lowest of the set, one command, unless
  -- some stay there) and expired ids without data or of an unknown format.
  if #migrate > 0 then chunks('HSET', KEYS[3], migrate) end
  if #count > 0 then chunks('HSET', KEYS[4], count) end
  if #leases > 0 then chunks('ZADD', KEYS[2], leases) end
  if #later > 0 then
    chunks('ZADD', KEYS[1], later)
    if #taken > 0 then chunks('ZREM', KEYS[1], taken) end
  elseif fromDue > 0 then
    redis.call('ZREMRANGEBYRANK', KEYS[1], 0, fromDue - 1)
  end
  if #gone > 0 then
    chunks('HDEL', KEYS[4], gone)
    chunks('ZREM', KEYS[2], gone)
  end
  if #unleased > 0 then chunks('ZREM', KEYS[2], unleased) end
end
local nd = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nd > 0 then out[2] = tonumber(nd[2]) end
local nl = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #nl > 0 then out[3] = math.ceil(tonumber(nl[2])) end
return out
`)

// ackScript settles claimed envelopes. ARGV[1] is the retry delay in ms
// for releases, then per envelope 5 values: id, claim token (its lease
// score), op, error, and its own retry delay in ms ("" for ARGV[1]).
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
// Returns {now ms, number settled, number of them moved to the dead set}.
// Allowed over maxmemory: settling is what frees memory.
var ackScript = newScript("allow-oom", `
local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local now = nowMs()
local ids = {}
for i = 2, #ARGV, 5 do ids[#ids+1] = ARGV[i] end
if #ids == 0 then return {now, 0, 0} end
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
  local k = 2 + (j - 1) * 5
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
        again[#again+1] = now + (tonumber(ARGV[k+4]) or tonumber(ARGV[1]))
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
    local n, b = claimsOf(prevs[j])
    counts[#counts+1] = id
    counts[#counts+1] = claimsValue(n + 1, b)
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
      fresh[#fresh+1] = stamp(nexts[2 * j], occurrence + 1, string.sub(v, from), markOf(v))
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
return {now, #settled, #dead / 2}
`)

// replayScript moves dead envelopes (ARGV: ids) back to due at once. The
// attempts counted so far stay, so the next delivery carries the next
// attempt number, and all of them now count before the replay: the
// envelope gets a fresh budget of tries. Returns {now ms, how many were
// dead}.
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
local again, migrate, budget, none = {}, {}, {}, {}
for _, id in ipairs(ids) do
  again[#again+1] = now
  again[#again+1] = id
  local v = redis.call('HGET', KEYS[3], id)
  local c = redis.call('HGET', KEYS[4], id)
  -- A value stored by a version without the value header keeps its due
  -- time only in its claims value, which is rewritten now: stamp it first.
  if unstamped(v) then
    migrate[#migrate+1] = id
    migrate[#migrate+1] = stamp(oldDue(c) or now, 0, v)
  end
  local n = claimsOf(c)
  if n > 0 then
    budget[#budget+1] = id
    budget[#budget+1] = claimsValue(n, n)
  elseif c then
    none[#none+1] = id
  end
end
if #ids > 0 then
  if #migrate > 0 then chunks('HSET', KEYS[3], migrate) end
  if #budget > 0 then chunks('HSET', KEYS[4], budget) end
  chunks('ZADD', KEYS[1], again)
  if #none > 0 then chunks('HDEL', KEYS[4], none) end
  chunks('HDEL', KEYS[6], ids)
  chunks('ZREM', KEYS[5], ids)
end
return {now, #ids}
`)

var allScripts = []*script{scheduleScript, cancelScript, claimScript, ackScript, replayScript, checkScript,
	heartbeatScript, ownScript}
