-- ack settles claimed envelopes (Ack, ack.go) of one or more shards in one
-- call. ARGV[1] is the retry delay in ms for releases, ARGV[2] how long a
-- tombstone answers resends (ms after its time; 0: none are kept), then
-- per shard: its key tag ("{<ns>:<shard>}:", keys.go: the shard's keys are
-- named from it; KEYS are the first shard's, declared so that Redis
-- Cluster routes the call, and the function's allow-cross-slot-keys lets
-- it reach the other shards of the node), the number m of its settles,
-- then per settle 5 values: id, claim token (its lease score), op, error,
-- and a time in ms: its own retry delay ("" for ARGV[1]), or as the op
-- says.
-- Ops: "a" ack (delivered: delete), "r" release (back to due after the
-- retry delay), "u" unreachable (like "r", but the attempt is not counted:
-- nothing was written to the network), "d" dead (to the dead set), and
-- "n" for an occurrence of a series delivered: the next occurrence is due
-- at the time, with fresh attempts, and "t" for a delivered one-shot whose
-- request is remembered: like "a", and its error field is the request's
-- fingerprint, kept with the id in the done set (keys.go) at the time (its
-- due time, or when it was accepted if later), until ARGV[2] ms after it,
-- and "h" held by flow control: back to due at the time, an absolute ms
-- (a rate limit's slot, or a paused target's parking place), the attempt
-- not counted and no error recorded.
-- Every call drops the tombstones past that of the shards it settles.
-- A non-empty error is recorded.
-- A settle whose token is not the id's current lease score is ignored: the
-- id was replaced, cancelled, or re-claimed after its lease expired, and a
-- stale daemon must not touch the newer claim. A settle ends the lease, so
-- a resent settle changes nothing.
-- Every shard is read before any is written: a shard whose slot is not on
-- this node (a Cluster slot moving) fails the call before it wrote
-- anything.
-- Returns {now ms, number settled, number of them moved to the dead set}.
-- Allowed over maxmemory: settling is what frees memory.

local now = nowMs()
local retry, remember = tonumber(ARGV[1]), tonumber(ARGV[2]) or 0
-- The tombstones' prune (all of them when none are kept), formatted once.
local below = remember > 0 and '(' .. ms(now - remember) or '+inf'

-- read reads one shard, whose tag is ARGV[a] and whose m settles follow:
-- every key it writes below, before any shard is written (prelude).
-- Returns the shard's plan for write, and where the next shard starts.
local function read(a)
  local tag, m = ARGV[a], tonumber(ARGV[a+1])
  local p = {due = tag .. 'due', inflight = tag .. 'inflight', data = tag .. 'data', attempts = tag .. 'attempts',
    dead = tag .. 'dead', errors = tag .. 'errors', done = tag .. 'done'}
  -- The ids one claim leased share its score: one exact range read per
  -- token finds those still leased by it (ZMSCORE would format a double
  -- per id instead). A token is a lease score (prelude, isToken);
  -- anything else matches nothing.
  local leased = {}
  local settled, acked, errs, count, again, buried, nexts, tombs = {}, {}, {}, {}, {}, {}, {}, {}
  -- Counters, not #t: the work per settle is what an ack costs beyond
  -- its commands.
  local ns, na, nt = 0, 0, 0
  for k = a + 2, a + 1 + 5 * m, 5 do
    local id, token, op, err, at = ARGV[k], ARGV[k+1], ARGV[k+2], ARGV[k+3], ARGV[k+4]
    local set = leased[token]
    if not set then
      set = {}
      if isToken(token) then
        for _, x in ipairs(redis.call('ZRANGEBYSCORE', p.inflight, token, token)) do set[x] = true end
      end
      leased[token] = set
    end
    if set[id] then
      -- Out of the set: an id settled twice in one call counts once, as
      -- it would across two calls (an id has one lease score).
      set[id] = nil
      ns = ns + 1
      settled[ns] = id
      if op == 'a' then
        na = na + 1
        acked[na] = id
      elseif op == 't' then
        na = na + 1
        acked[na] = id
        local since = tonumber(at)
        if since and err ~= '' and remember > 0 then
          -- The time as it came, a string: a number is formatted as a
          -- float, several times dearer.
          tombs[nt+1], tombs[nt+2], nt = at, err .. id, nt + 2
        end
      elseif op == 'n' then
        nexts[#nexts+1] = id
        nexts[#nexts+1] = tonumber(at)
      else
        if err ~= '' then
          errs[#errs+1] = id
          errs[#errs+1] = err
        end
        if op == 'h' then
          again[#again+1] = at
          again[#again+1] = id
        elseif op == 'd' then
          count[#count+1] = id
          buried[#buried+1] = now
          buried[#buried+1] = id
        else
          if op ~= 'u' then count[#count+1] = id end
          again[#again+1] = now + (tonumber(at) or retry)
          again[#again+1] = id
        end
      end
    end
  end
  p.settled, p.acked, p.errs, p.count, p.again, p.buried, p.nexts, p.tombs =
    settled, acked, errs, count, again, buried, nexts, tombs
  -- The values of next occurrences, the attempts to count, and whether
  -- attempts and errors hold anything (retries and errors are rare: an
  -- acked id's entries are deleted only when there are any).
  p.restamp = {}
  for i = 1, #nexts, 2 do p.restamp[#p.restamp+1] = nexts[i] end
  p.vals, p.prevs = {}, {}
  if #p.restamp > 0 then p.vals = hmget(p.data, p.restamp) end
  if #count > 0 then p.prevs = hmget(p.attempts, count) end
  p.nAttempts, p.nErrors = 0, 0
  if #acked > 0 or #p.restamp > 0 then p.nAttempts = redis.call('HLEN', p.attempts) end
  if #acked > 0 or #p.restamp > 0 or #errs > 0 then p.nErrors = redis.call('HLEN', p.errors) end
  -- The keys only written: their type read, but for done, whose prune is
  -- the first write.
  if #again > 0 or #nexts > 0 then redis.call('ZCARD', p.due) end
  if #buried > 0 then redis.call('ZCARD', p.dead) end
  if #acked > 0 and #p.restamp == 0 then redis.call('HLEN', p.data) end
  -- The first shard's prune is the call's first write.
  if a > 3 then redis.call('ZCARD', p.done) end
  return p, a + 2 + 5 * m
end

-- write settles what read planned.
local function write(p)
  -- Tombstones past the window go, whether or not this call adds any (a
  -- shard whose named deliveries stopped, a fleet that turned resends
  -- off: then all, by a command that fails on a key of the wrong type, as
  -- DEL would not).
  redis.call('ZREMRANGEBYSCORE', p.done, '-inf', below)
  -- Adds first (errors, counts, the new place), removals last.
  if #p.errs > 0 then chunks('HSET', p.errors, p.errs) end
  if #p.count > 0 then
    local counts = {}
    for j, id in ipairs(p.count) do
      local n, b = attemptsOf(p.prevs[j])
      counts[#counts+1] = id
      counts[#counts+1] = attemptsValue(n + 1, b)
    end
    chunks('HSET', p.attempts, counts)
  end
  if #p.again > 0 then chunks('ZADD', p.due, p.again) end
  if #p.buried > 0 then chunks('ZADD', p.dead, p.buried) end
  -- A series' next occurrence: due first, then out of inflight (below),
  -- then its value's header. A cut before the header is rewritten can
  -- only deliver the last occurrence again, never the next one early.
  for i = 1, #p.nexts, 2 do
    redis.call('ZADD', p.due, p.nexts[i+1], p.nexts[i])
  end
  if #p.settled > 0 then chunks('ZREM', p.inflight, p.settled) end
  if #p.restamp > 0 then
    local fresh = {}
    for j, id in ipairs(p.restamp) do
      local v = p.vals[j]
      if v then
        local occurrence, from = occurrenceOf(v)
        fresh[#fresh+1] = id
        fresh[#fresh+1] = stamp(p.nexts[2 * j], occurrence + 1, string.sub(v, from), markOf(v))
      end
    end
    if #fresh > 0 then chunks('HSET', p.data, fresh) end
    if p.nAttempts > 0 then chunks('HDEL', p.attempts, p.restamp) end
    if p.nErrors > 0 then chunks('HDEL', p.errors, p.restamp) end
  end
  if #p.tombs > 0 then
    -- Remembered before the data goes: a cut in between leaves a
    -- tombstone beside the delivered version, out of every index (check's
    -- repair makes it due now), and a resend is answered from the
    -- tombstone.
    chunks('ZADD', p.done, p.tombs)
  end
  if #p.acked > 0 then
    if p.nAttempts > 0 then chunks('HDEL', p.attempts, p.acked) end
    if p.nErrors > 0 then chunks('HDEL', p.errors, p.acked) end
    chunks('HDEL', p.data, p.acked)
  end
end

local plans, a = {}, 3
while a <= #ARGV do
  plans[#plans+1], a = read(a)
end
local settled, buried = 0, 0
for _, p in ipairs(plans) do
  write(p)
  settled, buried = settled + #p.settled, buried + #p.buried / 2
end
return {now, settled, buried}
