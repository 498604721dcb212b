-- claim hands out envelopes for delivery (Claim, claim.go) from one or
-- more shards in one call: up to ARGV[1] a shard, each with a lease of
-- ARGV[2] ms: first those whose lease expired (re-leased in place, so a
-- backlog of due ones never starves them; the expired lease is counted as
-- an attempt now), then due ones, which move from due to inflight. The
-- lease score is the claim's token, unique in its shard (token, below;
-- keys.go), from the hint k = ARGV[3] (1..991). ARGV[4] is the newest value
-- format this daemon reads, as its series mark: a value of a newer format
-- is given back untouched, uncounted, due again in a second, for a daemon
-- that reads it.
-- Then per shard 4 values: its key tag ("{<ns>:<shard>}:": its keys are
-- named from it; KEYS are the first shard's, for Redis Cluster to route
-- the call, and allow-cross-slot-keys lets it reach the node's other
-- shards), the bytes of values it may hand out (0: no bound; see take),
-- "1" when its first large one may go out even if alone larger (so none
-- can stall its shard; the caller grants it to a few shards in turn), and
-- "1" when the shard is known to hold large values (store.go, largeUntil).
-- Every shard is read before any is written: a shard whose slot is not on
-- this node fails the call having written nothing, and the caller claims
-- shard by shard instead.
-- Returns {now µs (for the scanner's wake-ups), then per shard: next due
-- ms or -1, next lease expiry ms (rounded up) or -1, ids without data
-- (removed behind delayd's back), expired leases re-claimed, the token,
-- values of an unknown format given back, their newest mark (0: none), 1
-- if a value over 4 kB was seen, the number of envelopes n, then n times:
-- id, attempt (n + 1, or "n+1/b": keys.go, attempts), stored value}.
-- Allowed over maxmemory: delivering is what frees memory.

-- token takes the token of a claim at now with a lease of length ms (a
-- string) and hint k (1..991), from the lease hash h as HGETALL read it:
-- see the lease key in keys.go. Returns the token, the hash value to
-- write, and the lengths whose leases all ended (to drop: every token
-- they handed out is below any new one).
local function token(h, now, length, k)
  local top, mine, ended = {}, nil, {}
  for i = 1, #h, 2 do
    local c, t = string.match(h[i+1], '^(%d):(%d+)$')
    c, t = tonumber(c), tonumber(t)
    if c and t >= now * 1000 then
      top[c] = math.max(top[c] or 0, t)
      if h[i] == length then mine = c end
    else
      ended[#ended+1] = h[i]
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
  t = string.format('%d', t)
  return t, mine .. ':' .. t, ended
end

-- take reads the values of ids (expired leases first, then due ids, in
-- order) from the data hash, keeping those that fit in budget bytes (0:
-- all): values of at most budget/16 bytes ("small") fit while the kept
-- bytes stay within budget, or their own bytes within a quarter of it;
-- larger ones while the large bytes stay within three quarters, or, with
-- oversize, the first large one whatever its size. A value that does not
-- fit is skipped, not a wall: smaller ones due after it still go out, and
-- it stays where it is, first in line for the next claim. So small
-- envelopes are not held up behind large ones, and a shard holds at most
-- its budget, or one over-large value plus a quarter.
-- Large HMGET replies cost a script far more than their bytes (Redis 7.0:
-- 16 values of 900 kB in one take 1.4 s, one HGET each 80 ms), so values
-- are read 4, then 16 at a time while small; once one is over 4 kB (or
-- from the first with sizeAll), each is sized (HSTRLEN) and read alone if
-- it fits; the first is always sized before any is read. Returns the kept
-- ids, their values (false for an id without data: reported missing), how
-- many were expired leases, whether any was skipped, and whether a value
-- over 4 kB was seen.
local function take(data, ids, expired, budget, oversize, sizeAll)
  local keep, vals, kept, skipped = {}, {}, 0, false
  local smallMax, smallBudget, largeBudget = budget / 16, budget / 4, budget * 3 / 4
  local bytes, small, large, tookLarge = 0, 0, 0, false
  local function offer(i, v, size)
    if budget > 0 then
      if size <= smallMax then
        if bytes + size > budget and small + size > smallBudget then skipped = true return end
        small = small + size
      else
        if large + size > largeBudget and (tookLarge or not oversize) then skipped = true return end
        large, tookLarge = large + size, true
      end
      bytes = bytes + size
    end
    keep[#keep+1] = ids[i]
    vals[#vals+1] = v or false
    if i <= expired then kept = kept + 1 end
  end
  -- The first value is sized before any is read: a shard whose due ids
  -- begin with large values (they sort first, or were skipped by the
  -- last claim and are first in line) reads none of them in the HMGET of
  -- four, which alone took as long as the rest of the claim.
  local i, step = 1, 4
  local probe = redis.call('HSTRLEN', data, ids[1])
  local sized = sizeAll or probe > 4096
  local sawLarge = probe > 4096
  while i <= #ids do
    if budget > 0 and bytes >= budget and small >= smallBudget then
      skipped = true
      break
    end
    if sized then
      local size = probe
      if i > 1 then size = redis.call('HSTRLEN', data, ids[i]) end
      if size > 4096 then sawLarge = true end
      if size == 0 then offer(i, nil, 0)
      elseif budget == 0 or (size <= smallMax and (bytes + size <= budget or small + size <= smallBudget))
          or (size > smallMax and (large + size <= largeBudget or (oversize and not tookLarge))) then
        offer(i, redis.call('HGET', data, ids[i]), size)
      else
        skipped = true
      end
      i = i + 1
    else
      local last = math.min(i + step - 1, #ids)
      local part = redis.call('HMGET', data, unpack(ids, i, last))
      for j = 1, #part do
        local size = part[j] and #part[j] or 0
        if size > 4096 then sized, sawLarge = true, true end
        offer(i + j - 1, part[j], size)
      end
      i, step = last + 1, 16
    end
  end
  if i <= #ids then skipped = true end
  return keep, vals, kept, skipped, sawLarge
end

local now, nowus = nowMs()
local max, length, hint, known = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
-- Formatted once a call, not once a shard.
local nowS, endedS, maxS = ms(now), ms(now * 1000), ms(max)

-- read reads one shard (its tag and ARGV from a): every key it writes
-- below, before any shard is written (prelude): inflight, due (its type
-- only, when expired leases fill the claim), data, attempts and lease.
-- Returns the shard's plan for write.
local function read(a)
  local tag = ARGV[a]
  local p = {due = tag .. 'due', inflight = tag .. 'inflight', attempts = tag .. 'attempts', lease = tag .. 'lease',
    missing = 0, expired = 0, large = 0}
  -- Expired leases: tokens at or below now x 1000.
  local ids = redis.call('ZRANGEBYSCORE', p.inflight, '-inf', endedS, 'LIMIT', '0', maxS)
  local expired = #ids
  if expired == 0 then
    ids = redis.call('ZRANGEBYSCORE', p.due, '-inf', nowS, 'LIMIT', '0', maxS)
  elseif expired < max then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', p.due, '-inf', nowS, 'LIMIT', '0', ms(max - expired))) do
      ids[#ids+1] = id
    end
  else
    redis.call('ZCARD', p.due)
  end
  if #ids == 0 then return p end
  local datas, sawLarge
  ids, datas, expired, p.skipped, sawLarge = take(tag .. 'data', ids, expired, tonumber(ARGV[a+1]) or 0,
    ARGV[a+2] == '1', ARGV[a+3] == '1')
  if sawLarge then p.large = 1 end
  if #ids == 0 then return p end
  p.ids, p.datas, p.expired = ids, datas, expired
  -- Most shards have no retries at all: then there is nothing to read.
  p.prevs = {}
  if redis.call('HLEN', p.attempts) > 0 then p.prevs = hmget(p.attempts, ids) end
  p.token, p.leased, p.ended = token(redis.call('HGETALL', p.lease), now, length, hint)
  return p
end

-- write claims what read planned, and appends the shard's reply to out.
local function write(p, out)
  local head = #out
  out[head+1], out[head+2], out[head+3], out[head+4], out[head+5] = -1, -1, 0, p.expired, p.token or ''
  out[head+6], out[head+7], out[head+8], out[head+9] = 0, 0, p.large, 0
  local ids = p.ids
  if ids then
    -- The token first: a cut after it only skips a token.
    if #p.ended > 0 then redis.call('HDEL', p.lease, unpack(p.ended)) end
    redis.call('HSET', p.lease, length, p.leased)
    local count, leases, gone, later, unleased, taken = {}, {}, {}, {}, {}, {}
    -- Counters, not #t: the work per envelope is what a claim costs
    -- beyond its commands.
    local n, o, nl, nt, prevs, tok = 0, #out, 0, 0, p.prevs, p.token
    for j, id in ipairs(ids) do
      local v = p.datas[j]
      local m = v and string.byte(v, 1) or 0
      if m > known then
        -- A format this daemon cannot read: leave it as it is.
        out[head+6] = out[head+6] + 1
        out[head+7] = math.max(out[head+7], m - (m - 240) % 2)
        later[#later+1] = now + 1000
        later[#later+1] = id
        if j <= p.expired then unleased[#unleased+1] = id end
      else
        if j > p.expired then
          nt = nt + 1
          taken[nt] = id
        end
        if v then
          local c, b = 0, 0
          if prevs[j] then c, b = attemptsOf(prevs[j]) end
          if j <= p.expired then
            c = c + 1
            count[#count+1] = id
            count[#count+1] = attemptsValue(c, b)
          end
          leases[nl+1], leases[nl+2], nl = tok, id, nl + 2
          out[o+1], out[o+2], out[o+3], o = id, attemptsValue(c + 1, b), v, o + 3
          n = n + 1
        else
          out[head+3] = out[head+3] + 1
          if j <= p.expired then gone[#gone+1] = id end
        end
      end
    end
    out[head+9] = n
    out[head+4] = p.expired - #unleased - #gone
    -- Adds first: the counts and leases, unknown formats due again.
    -- Removals last: the due ids (the lowest of the set, one command,
    -- unless some stay there) and expired ids without data or of an
    -- unknown format.
    if #count > 0 then chunks('HSET', p.attempts, count) end
    if #leases > 0 then chunks('ZADD', p.inflight, leases) end
    if #later > 0 then
      chunks('ZADD', p.due, later)
      if #taken > 0 then chunks('ZREM', p.due, taken) end
    elseif #taken > 0 and p.skipped then
      chunks('ZREM', p.due, taken)
    elseif #taken > 0 then
      redis.call('ZREMRANGEBYRANK', p.due, 0, #taken - 1)
    end
    if #gone > 0 then
      chunks('HDEL', p.attempts, gone)
      chunks('ZREM', p.inflight, gone)
    end
    if #unleased > 0 then chunks('ZREM', p.inflight, unleased) end
  end
  local nd = redis.call('ZRANGE', p.due, 0, 0, 'WITHSCORES')
  if #nd > 0 then out[head+1] = tonumber(nd[2]) end
  -- The lease that ends first, in the ms its token's ends in.
  local nl = redis.call('ZRANGE', p.inflight, 0, 0, 'WITHSCORES')
  if #nl > 0 then out[head+2] = math.ceil(tonumber(nl[2]) / 1000) end
end

local plans = {}
for a = 5, #ARGV, 4 do plans[#plans+1] = read(a) end
local out = {nowus}
for _, p in ipairs(plans) do write(p, out) end
return out
