-- reserve gives delivery slots under one rate limit (Reserve, flow.go):
-- GCRA, one slot per envelope, decided once. KEYS[1] is the limit's
-- theoretical arrival time (a string, µs), KEYS[2] its ledger (ZSET id →
-- slot ms) of the envelopes held for a slot not reached yet, KEYS[3] its
-- count of deliveries let go (HASH: s, the current second; n, its count;
-- p, the count of the second before it), for the operator's current
-- rate. ARGV[1] is
-- the emission interval in µs (1 s / rate), ARGV[2] the burst, then ids.
-- An id in the ledger gets the slot it was given (and leaves the ledger):
-- a held envelope claimed again at its slot is not slotted twice, so a
-- herd of N costs O(N). A new id gets the first slot GCRA allows: max(now,
-- tat - (burst - 1) x interval), and tat moves on by one interval; one
-- whose slot is later than now goes into the ledger. Ledger entries an
-- hour past their slot (a held envelope cancelled, or claimed that much
-- late) are dropped.
-- Returns {now ms, then per id its slot ms (now or earlier: deliver now)}.
-- Without the shard prelude. Allowed over maxmemory: it holds envelopes
-- back, and their deliveries are what frees memory.
local tatKey, ledger, counts = KEYS[1], KEYS[2], KEYS[3]
local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(nowus / 1000)
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tolerance = (burst - 1) * interval
local tat = math.max(tonumber(redis.call('GET', tatKey)) or 0, nowus)
redis.call('ZREMRANGEBYSCORE', ledger, '-inf', string.format('(%d', now - 3600000))
local ids = {}
for i = 3, #ARGV do ids[#ids+1] = ARGV[i] end
local have = {}
for i = 1, #ids, 512 do
  local part = redis.call('ZMSCORE', ledger, unpack(ids, i, math.min(i + 511, #ids)))
  for j = 1, #part do have[#have+1] = part[j] end
end
local out, held, granted, moved, going = {now}, {}, {}, false, 0
for i, id in ipairs(ids) do
  if have[i] then
    out[#out+1] = tonumber(have[i])
    if tonumber(have[i]) <= now then
      granted[#granted+1] = id
      going = going + 1
    end
  else
    local slot = math.max(nowus, tat - tolerance)
    tat, moved = math.max(tat, slot) + interval, true
    -- In whole ms, rounded up: never before the slot.
    local ms = now
    if slot > nowus then ms = math.ceil(slot / 1000) end
    out[#out+1] = ms
    if ms > now then
      held[#held+1] = ms
      held[#held+1] = id
    else
      going = going + 1
    end
  end
end
if moved then
  -- Kept while it holds anything back, and a minute beyond.
  redis.call('SET', tatKey, string.format('%d', tat), 'PX', math.floor((tat - nowus) / 1000) + 60000)
end
for i = 1, #held, 512 do redis.call('ZADD', ledger, unpack(held, i, math.min(i + 511, #held))) end
for i = 1, #granted, 512 do redis.call('ZREM', ledger, unpack(granted, i, math.min(i + 511, #granted))) end
if going > 0 then
  local sec = math.floor(now / 1000)
  local c = redis.call('HMGET', counts, 's', 'n')
  local s, n = tonumber(c[1]) or 0, tonumber(c[2]) or 0
  if s == sec then
    redis.call('HINCRBY', counts, 'n', going)
  else
    local p = 0
    if s == sec - 1 then p = n end
    redis.call('HSET', counts, 's', sec, 'n', going, 'p', p)
    redis.call('PEXPIRE', counts, 10000)
  end
end
return out
