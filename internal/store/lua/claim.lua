-- claim hands out up to ARGV[1] envelopes for delivery (Claim, claim.go),
-- each with a lease of ARGV[2] ms: first those whose lease expired (their
-- daemon died or stalled; they are re-leased in place, so a backlog of due
-- envelopes can never starve them), then due ones, which move from due to
-- inflight. The expired lease was an attempt: it is counted in attempts
-- now.
-- The lease score is the claim's token: the expiry plus about k/1000 ms,
-- k = ARGV[3] (1..991), unique in the shard (leaseToken, below; keys.go).
-- ARGV[4] is the newest value format this daemon reads, as its series
-- mark: a value of a newer format (a newer daemon wrote it) is not handed
-- out, nor rewritten or counted: it is given back, due again in a second,
-- for a daemon that knows its format.
-- ARGV[5] bounds the bytes of stored values handed out (0: no bound):
-- envelopes are added while they fit in it; with ARGV[6] "1" the first is
-- handed out even if it alone is larger (so one over-large envelope can
-- never stall its shard; the caller grants that to one shard per claim,
-- so a claim holds at most its bound plus one payload). The values are
-- read 16 at a time, so Redis holds little more than the bound either.
-- Returns {now µs, next due ms or -1, next lease expiry ms (rounded up) or
-- -1, number of ids that had no data (removed behind delayd's back),
-- number of expired leases re-claimed, the lease score (the settles'
-- token), number of values of an unknown format given back, the newest
-- such mark (0 for none), then per envelope: id, attempt, stored value}.
-- The attempt is n + 1, or "n+1/b" when b > 0 (the attempts hash,
-- keys.go). "now" is in µs so the scanner can time its next wake-up to
-- better than a millisecond.
-- Allowed over maxmemory: delivering is what frees memory.
local due, inflight, data, attempts, lease = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[7]

-- leaseToken takes the token of a claim at now with a lease of length ms
-- (a string) and hint k (1..991): see the lease key in keys.go. It is
-- written first: a cut after it only skips a token.
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
  redis.call('HSET', lease, length, mine .. ':' .. string.format('%d', t))
  return string.format('%d.%03d', (t - t % 1000) / 1000, t % 1000)
end

local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local now, nowus = nowMs()
local max = tonumber(ARGV[1])
local known = tonumber(ARGV[4])
local out = {nowus, -1, -1, 0, 0, '', 0, 0}
local ids = redis.call('ZRANGEBYSCORE', inflight, '-inf', now, 'LIMIT', 0, max)
local expired = #ids
if expired < max then
  local ready = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, max - expired)
  for i = 1, #ready do ids[#ids+1] = ready[i] end
end
local datas
local budget = tonumber(ARGV[5]) or 0
if budget > 0 and #ids > 0 then
  datas = {}
  local bytes, full = 0, false
  local oversize = ARGV[6] == '1'
  for i = 1, #ids, 16 do
    local part = redis.call('HMGET', data, unpack(ids, i, math.min(i + 15, #ids)))
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
  local token = leaseToken(now, ARGV[2], tonumber(ARGV[3]))
  out[6] = token
  datas = datas or hmget(data, ids)
  -- Most shards have no retries at all: then there is nothing to read.
  local prevs = {}
  if redis.call('HLEN', attempts) > 0 then prevs = hmget(attempts, ids) end
  local count, leases, gone, migrate, later, unleased, taken = {}, {}, {}, {}, {}, {}, {}
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
      if v and bare(v) then
        -- Stored by the version before the value header (prelude).
        v = stampBare(v, prevs[j], now, j > expired and due or nil, id)
        migrate[#migrate+1] = id
        migrate[#migrate+1] = v
      end
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
  if #migrate > 0 then chunks('HSET', data, migrate) end
  if #count > 0 then chunks('HSET', attempts, count) end
  if #leases > 0 then chunks('ZADD', inflight, leases) end
  if #later > 0 then
    chunks('ZADD', due, later)
    if #taken > 0 then chunks('ZREM', due, taken) end
  elseif fromDue > 0 then
    redis.call('ZREMRANGEBYRANK', due, 0, fromDue - 1)
  end
  if #gone > 0 then
    chunks('HDEL', attempts, gone)
    chunks('ZREM', inflight, gone)
  end
  if #unleased > 0 then chunks('ZREM', inflight, unleased) end
end
local nd = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
if #nd > 0 then out[2] = tonumber(nd[2]) end
local nl = redis.call('ZRANGE', inflight, 0, 0, 'WITHSCORES')
if #nl > 0 then out[3] = math.ceil(tonumber(nl[2])) end
return out
