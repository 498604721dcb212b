-- reserve gives delivery slots under one rate limit (Reserve, flow.go):
-- GCRA, one slot per envelope, decided once. KEYS[1] is the limit's
-- theoretical arrival time (a string, µs), KEYS[2] its ledger (ZSET id →
-- slot ms) of the envelopes held for a slot not reached yet, KEYS[3] its
-- count of deliveries let go (HASH: s, the current second; n, its count;
-- p, the count of the second before it), for the operator's current
-- rate, KEYS[4] the rules (HASH, flow.go), all of one hash tag. ARGV[1]
-- is the limit's field there ("limit:<pattern>": "<rate> <interval µs>
-- <burst>"), then pairs of id and due ms.
-- The rule is read here, so a change or a removal reaches every daemon's
-- next slot at once: with the rule gone every id goes now, and nothing
-- is written.
-- An id in the ledger gets the slot it was given (and leaves the ledger
-- once it is reached): a held envelope claimed again at its slot is not
-- slotted twice, so a herd of N costs O(N). A ledger slot before the id's
-- due time, or more than 5 s past, was not given for this claim (a
-- replaced version's, or one held by a pause meanwhile): the id gets a
-- new one. A new slot is the first GCRA allows: max(now, tat - (burst -
-- 1) x interval), and tat moves on by one interval; one later than now
-- goes into the ledger, whose marker ("slotted:<pattern>" in the rules)
-- tells the daemons to release it should the rule go. Ledger entries an
-- hour past their slot are dropped.
-- Returns {now ms, then per id its slot ms (now or earlier: deliver now)}.
-- Without the shard prelude. Allowed over maxmemory: it holds envelopes
-- back, and their deliveries are what frees memory.
local tatKey, ledger, counts, rules = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(nowus / 1000)
local out = {now}
local rule = redis.call('HGET', rules, ARGV[1])
local interval, burst
if rule then interval, burst = string.match(rule, '^%S+ (%d+) (%d+)$') end
interval, burst = tonumber(interval), tonumber(burst)
if not interval or interval <= 0 or not burst or burst < 1 then
  for i = 2, #ARGV, 2 do out[#out+1] = now end
  return out
end
local tolerance = (burst - 1) * interval
local tat = math.max(tonumber(redis.call('GET', tatKey)) or 0, nowus)
redis.call('ZREMRANGEBYSCORE', ledger, '-inf', string.format('(%d', now - 3600000))
local ids = {}
for i = 2, #ARGV, 2 do ids[#ids+1] = ARGV[i] end
local have = {}
for i = 1, #ids, 512 do
  local part = redis.call('ZMSCORE', ledger, unpack(ids, i, math.min(i + 511, #ids)))
  for j = 1, #part do have[#have+1] = part[j] end
end
local held, granted, moved, going = {}, {}, false, 0
for i, id in ipairs(ids) do
  local given, due = tonumber(have[i]), tonumber(ARGV[2 * i + 1]) or 0
  if given and given >= due and given >= now - 5000 then
    out[#out+1] = given
    if given <= now then
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
      if given then granted[#granted+1] = id end
    end
  end
end
if moved then
  -- Kept while it holds anything back, and a minute beyond.
  redis.call('SET', tatKey, string.format('%d', tat), 'PX', math.floor((tat - nowus) / 1000) + 60000)
end
if #held > 0 then
  redis.call('HSET', rules, 'slotted:' .. string.sub(ARGV[1], 7), '1')
  for i = 1, #held, 512 do redis.call('ZADD', ledger, unpack(held, i, math.min(i + 511, #held))) end
end
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
