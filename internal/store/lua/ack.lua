-- ack settles claimed envelopes (Ack, ack.go). ARGV[1] is the retry delay
-- in ms for releases, ARGV[2] how long a tombstone answers resends (ms
-- after its time; 0: none are kept), then per envelope 5 values: id, claim
-- token (its lease score), op, error, and its own retry delay in ms (""
-- for ARGV[1]).
-- Ops: "a" ack (delivered: delete), "r" release (back to due after the
-- retry delay), "u" unreachable (like "r", but the attempt is not counted:
-- nothing was written to the network), "d" dead (to the dead set), and
-- "n:<due ms>" for an occurrence of a series delivered: the next
-- occurrence is due then, with fresh attempts, and "t:<ms>" for a
-- delivered one-shot whose request is remembered: like "a", and its error
-- field is the request's fingerprint, kept with the id in the done set
-- (keys.go) at that time (its due time, or when it was accepted if later),
-- until ARGV[2] ms after it. Every call drops the tombstones past that.
-- A non-empty error is recorded.
-- A settle whose token is not the id's current lease score is ignored: the
-- id was replaced, cancelled, or re-claimed after its lease expired, and a
-- stale daemon must not touch the newer claim. A settle ends the lease, so
-- a resent settle changes nothing.
-- Returns {now ms, number settled, number of them moved to the dead set}.
-- Allowed over maxmemory: settling is what frees memory.
local due, inflight, data, attempts, dead, errors, done = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[9]

local now = nowMs()
local ids = {}
local remember = tonumber(ARGV[2]) or 0
for i = 3, #ARGV, 5 do ids[#ids+1] = ARGV[i] end
if #ids == 0 then return {now, 0, 0} end
-- The ids one claim leased share its score: one exact range read per
-- token finds those still leased by it (ZMSCORE would format a double per
-- id instead). A token is a lease score (prelude, isToken); anything else
-- matches nothing.
local leased = {}
local function holds(tok, id)
  local set = leased[tok]
  if not set then
    set = {}
    if isToken(tok) then
      for _, m in ipairs(redis.call('ZRANGEBYSCORE', inflight, tok, tok)) do set[m] = true end
    end
    leased[tok] = set
  end
  return set[id]
end
local settled, acked, errs, count, again, buried, nexts, tombs = {}, {}, {}, {}, {}, {}, {}, {}
-- Every read comes before any write: an id settled twice in one call
-- must count once, as it would across two calls.
local handled = {}
for j, id in ipairs(ids) do
  local k = 3 + (j - 1) * 5
  local token, op, err, delay = ARGV[k+1], ARGV[k+2], ARGV[k+3], ARGV[k+4]
  if not handled[id] and holds(token, id) then
    handled[id] = true
    settled[#settled+1] = id
    if op == 'a' then
      acked[#acked+1] = id
    elseif string.sub(op, 1, 2) == 't:' then
      acked[#acked+1] = id
      local since = tonumber(string.sub(op, 3))
      if since and err ~= '' and remember > 0 then
        tombs[#tombs+1] = since
        tombs[#tombs+1] = err .. id
      end
    elseif string.sub(op, 1, 2) == 'n:' then
      nexts[#nexts+1] = id
      nexts[#nexts+1] = tonumber(string.sub(op, 3))
    else
      if err ~= '' then
        errs[#errs+1] = id
        errs[#errs+1] = err
      end
      if op ~= 'u' then count[#count+1] = id end
      if op == 'd' then
        buried[#buried+1] = now
        buried[#buried+1] = id
      else
        again[#again+1] = now + (tonumber(delay) or tonumber(ARGV[1]))
        again[#again+1] = id
      end
    end
  end
end
-- Reads before the first write (prelude): inflight above; the values of
-- next occurrences, the attempts to count, and whether attempts and
-- errors hold anything (retries and errors are rare: an acked id's
-- entries are deleted only when there are any).
local restamp = {}
for i = 1, #nexts, 2 do restamp[#restamp+1] = nexts[i] end
local vals = {}
if #restamp > 0 then vals = hmget(data, restamp) end
local prevs = {}
if #count > 0 then prevs = hmget(attempts, count) end
local nAttempts, nErrors = 0, 0
if #acked > 0 or #restamp > 0 then nAttempts = redis.call('HLEN', attempts) end
if #acked > 0 or #restamp > 0 or #errs > 0 then nErrors = redis.call('HLEN', errors) end
-- The keys only written: checked, but for done, whose prune is the first
-- write.
if #again > 0 or #nexts > 0 then checkKeys(0, 'due') end
if #buried > 0 then checkKeys(0, 'dead') end
if #acked > 0 and #restamp == 0 then checkKeys(0, 'data') end
-- Tombstones past the window go, whether or not this call adds any (a
-- shard whose named deliveries stopped, a fleet that turned resends off:
-- then all, by a command that fails on a key of the wrong type, as DEL
-- would not).
if remember > 0 then
  redis.call('ZREMRANGEBYSCORE', done, '-inf', '(' .. (now - remember))
else
  redis.call('ZREMRANGEBYSCORE', done, '-inf', '+inf')
end
-- Adds first (errors, counts, the new place), removals last.
if #errs > 0 then chunks('HSET', errors, errs) end
if #count > 0 then
  local counts = {}
  for j, id in ipairs(count) do
    local n, b = attemptsOf(prevs[j])
    counts[#counts+1] = id
    counts[#counts+1] = attemptsValue(n + 1, b)
  end
  chunks('HSET', attempts, counts)
end
if #again > 0 then chunks('ZADD', due, again) end
if #buried > 0 then chunks('ZADD', dead, buried) end
-- A series' next occurrence: due first, then out of inflight (below),
-- then its value's header. A cut before the header is rewritten can only
-- deliver the last occurrence again, never the next one early.
for i = 1, #nexts, 2 do
  redis.call('ZADD', due, nexts[i+1], nexts[i])
end
if #settled > 0 then chunks('ZREM', inflight, settled) end
if #restamp > 0 then
  local fresh = {}
  for j, id in ipairs(restamp) do
    local v = vals[j]
    if v then
      local occurrence, from = occurrenceOf(v)
      fresh[#fresh+1] = id
      fresh[#fresh+1] = stamp(nexts[2 * j], occurrence + 1, string.sub(v, from), markOf(v))
    end
  end
  if #fresh > 0 then chunks('HSET', data, fresh) end
  if nAttempts > 0 then chunks('HDEL', attempts, restamp) end
  if nErrors > 0 then chunks('HDEL', errors, restamp) end
end
if #tombs > 0 then
  -- Remembered before the data goes: a cut in between leaves a tombstone
  -- beside the delivered version, out of every index (check's repair
  -- makes it due now), and a resend is answered from the tombstone.
  chunks('ZADD', done, tombs)
end
if #acked > 0 then
  if nAttempts > 0 then chunks('HDEL', attempts, acked) end
  if nErrors > 0 then chunks('HDEL', errors, acked) end
  chunks('HDEL', data, acked)
end
return {now, #settled, #buried / 2}
