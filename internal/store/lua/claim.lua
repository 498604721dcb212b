-- claim hands out up to ARGV[1] envelopes for delivery (Claim, claim.go),
-- each with a lease of ARGV[2] ms: first those whose lease expired (their
-- daemon died or stalled; they are re-leased in place, so a backlog of due
-- envelopes can never starve them), then due ones, which move from due to
-- inflight. The expired lease was an attempt: it is counted in attempts
-- now.
-- The lease score is the claim's token, unique in the shard (leaseToken,
-- below; keys.go): expiry ms x 1000 + about k, k = ARGV[3] (1..991).
-- ARGV[4] is the newest value format this daemon reads, as its series
-- mark: a value of a newer format (a newer daemon wrote it) is not handed
-- out, nor rewritten or counted: it is given back, due again in a second,
-- for a daemon that knows its format.
-- ARGV[5] bounds the bytes of stored values handed out (0: no bound):
-- envelopes are added while they fit in it (see take); with ARGV[6] "1"
-- the first large one is handed out even if it alone is larger (so one
-- over-large envelope can never stall its shard; the caller grants that
-- to a few shards per claim in turn). With ARGV[7] "1" (the shard is known
-- to hold large values: store.go, largeUntil) every value is sized before
-- it is read (see take), so Redis holds little more than the bound
-- either; without, only once one over 4 kB was seen.
-- Returns {now µs, next due ms or -1, next lease expiry ms (rounded up) or
-- -1, number of ids that had no data (removed behind delayd's back),
-- number of expired leases re-claimed, the lease score (the settles'
-- token), number of values of an unknown format given back, the newest
-- such mark (0 for none), 1 if a value over 4 kB was seen (else 0), then
-- per envelope: id, attempt, stored value}.
-- The attempt is n + 1, or "n+1/b" when b > 0 (the attempts hash,
-- keys.go). "now" is in µs so the scanner can time its next wake-up to
-- better than a millisecond.
-- Allowed over maxmemory: delivering is what frees memory.
local due, inflight, data, attempts, lease = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[7]

-- leaseToken takes the token of a claim at now with a lease of length ms
-- (a string) and hint k (1..991): see the lease key in keys.go. It is
-- written first: a cut after it only skips a token. It returns the token.
local function leaseToken(now, length, k)
  local h = redis.call('HGETALL', lease)
  local top, mine = {}, nil
  for i = 1, #h, 2 do
    local c, t = string.match(h[i+1], '^(%d):(%d+)$')
    c, t = tonumber(c), tonumber(t)
    if c and t >= now * 1000 then
      top[c] = math.max(top[c] or 0, t)
      if h[i] == length then mine = c end
    else
      -- Ended: every token it handed out is below any new one.
      redis.call('HDEL', lease, h[i])
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
  redis.call('HSET', lease, length, mine .. ':' .. t)
  return t
end

-- take reads the values of ids (expired leases first, then due ids, in
-- order), keeping those that fit in budget bytes (0: all): values of at
-- most budget/16 bytes ("small") fit while the kept bytes stay within
-- budget, or their own bytes within a quarter of it; larger ones while
-- the large bytes stay within three quarters, or, with oversize, the
-- first large one whatever its size. A value that does not fit is
-- skipped, not a wall: smaller ones due after it still go out, and it
-- stays where it is, first in line for the next claim. So small
-- envelopes are not held up behind large ones, and a shard holds at most
-- its budget, or one over-large value plus a quarter.
-- HMGET replies inside a script cost far more than their bytes once they
-- are large (Redis 7.0: 16 values of 900 kB in one HMGET take 1.4 s, one
-- HGET each 80 ms), so values are read 4, then 16 at a time while they
-- are small; once one is over 4 kB, each is sized first (HSTRLEN) and
-- read alone only if it fits. With sizeAll (a shard known to hold large
-- values) that is so from the first value on; without, the first value
-- is sized before any is read, and large values behind a small first one
-- are read in the HMGET that finds them. Returns the kept ids, their
-- values (false for an id without data: kept, reported missing), how
-- many of them were expired leases, and sets skipped, and sawLarge once
-- a value over 4 kB was seen.
local skipped, sawLarge = false, false
local function take(ids, expired, budget, oversize, sizeAll)
  local keep, vals, kept = {}, {}, 0
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
  local probe = #ids > 0 and redis.call('HSTRLEN', data, ids[1]) or 0
  local sized = sizeAll or probe > 4096
  sawLarge = probe > 4096
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
  return keep, vals, kept
end

-- Every key is read before the first write (prelude), the lease key's
-- token: inflight and due (or, when expired leases fill the claim, due's
-- type checked), data and attempts.
local now, nowus = nowMs()
local max = tonumber(ARGV[1])
local known = tonumber(ARGV[4])
local out = {nowus, -1, -1, 0, 0, '', 0, 0, 0}
-- Expired leases: tokens at or below now x 1000.
local ids = redis.call('ZRANGEBYSCORE', inflight, '-inf', ms(now * 1000), 'LIMIT', '0', ms(max))
local expired = #ids
if expired < max then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', ms(now), 'LIMIT', '0', ms(max - expired))) do
    ids[#ids+1] = id
  end
else
  checkKeys(0, 'due')
end
local datas
if #ids > 0 then
  ids, datas, expired = take(ids, expired, tonumber(ARGV[5]) or 0, ARGV[6] == '1', ARGV[7] == '1')
  if sawLarge then out[9] = 1 end
end
if #ids > 0 then
  -- Most shards have no retries at all: then there is nothing to read.
  -- Read before the token is written.
  local prevs = {}
  if redis.call('HLEN', attempts) > 0 then prevs = hmget(attempts, ids) end
  local token = leaseToken(now, ARGV[2], tonumber(ARGV[3]))
  out[6] = token
  local count, leases, gone, later, unleased, taken = {}, {}, {}, {}, {}, {}
  for j, id in ipairs(ids) do
    local v = datas[j]
    local m = v and string.byte(v, 1) or 0
    if m > known then
      -- A format this daemon cannot read: leave it as it is.
      out[7] = out[7] + 1
      out[8] = math.max(out[8], m - (m - 240) % 2)
      later[#later+1] = now + 1000
      later[#later+1] = id
      if j <= expired then unleased[#unleased+1] = id end
    else
      if j > expired then taken[#taken+1] = id end
      if v then
        local n, b = attemptsOf(prevs[j])
        if j <= expired then
          n = n + 1
          count[#count+1] = id
          count[#count+1] = attemptsValue(n, b)
          out[5] = out[5] + 1
        end
        leases[#leases+1] = token
        leases[#leases+1] = id
        out[#out+1] = id
        out[#out+1] = attemptsValue(n + 1, b)
        out[#out+1] = v
      else
        out[4] = out[4] + 1
        if j <= expired then gone[#gone+1] = id end
      end
    end
  end
  -- Adds first: the counts and leases, unknown formats due again. Removals
  -- last: the due ids (the fromDue lowest of the set, one command, unless
  -- some stay there) and expired ids without data or of an unknown format.
  if #count > 0 then chunks('HSET', attempts, count) end
  if #leases > 0 then chunks('ZADD', inflight, leases) end
  if #later > 0 then
    chunks('ZADD', due, later)
    if #taken > 0 then chunks('ZREM', due, taken) end
  elseif #taken > 0 and skipped then
    chunks('ZREM', due, taken)
  elseif #taken > 0 then
    redis.call('ZREMRANGEBYRANK', due, 0, #taken - 1)
  end
  if #gone > 0 then
    chunks('HDEL', attempts, gone)
    chunks('ZREM', inflight, gone)
  end
  if #unleased > 0 then chunks('ZREM', inflight, unleased) end
end
local nd = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
if #nd > 0 then out[2] = tonumber(nd[2]) end
-- The lease that ends first, in the ms its token's ends in.
local nl = redis.call('ZRANGE', inflight, 0, 0, 'WITHSCORES')
if #nl > 0 then out[3] = math.ceil(tonumber(nl[2]) / 1000) end
return out
