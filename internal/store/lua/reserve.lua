-- reserve gives delivery slots under one rate limit (Reserve, flow.go):
-- GCRA, one slot per envelope, decided once. KEYS[1] is the limit's
-- clocks (a string "<tat µs> <sent µs>", below), KEYS[2] its ledger (ZSET
-- id -> slot ms) of the envelopes held for a slot, KEYS[3] its count of
-- deliveries let go (HASH: s, the current second; n, its count; p, the
-- count of the second before it), for the operator's current rate,
-- KEYS[4] the rules (HASH, flow.go), all of one hash tag. ARGV[1] is the
-- limit's field there ("limit:<pattern>": "<rate> <interval µs>
-- <burst>"), then pairs of id and due ms, in due order.
-- The rule is read here, so a change or a removal reaches every daemon's
-- next slot at once: with the rule gone every id goes now, and nothing
-- is written.
-- Two GCRA clocks: tat, of the slots given (a new slot is the first it
-- allows: max(now, tat - (burst - 1) x interval), and tat moves on by one
-- interval); sent, of the deliveries let go. A slot says when an envelope
-- may go, but it goes when claimed, and a claim can come late: after a
-- crash or a stall, or while a herd at one due time is still being
-- claimed as its first slots pass. Late ones sent at once would break the
-- rate, so one whose slot has come goes only if sent allows it (with
-- slack for claims' own few ms of lateness); if not, it takes the first
-- moment sent allows, counted there at once (its ledger score gets .5:
-- claimed then or later, it goes without asking again: asking again would
-- count it twice, behind every one counted since, and a claim that kept
-- coming late would never let it go), and is held until it.
-- Those after it then find sent ahead of their slots and queue behind it
-- the same way: the rate and the due order both hold, a straggler delays
-- the rest by an interval (not by its own lateness), and each envelope is
-- held at most twice (O(N) for a herd).
-- An id in the ledger gets its slot (and leaves the ledger once it goes);
-- a slot before the id's due time was a replaced version's: the id gets
-- a new one. One held goes into the ledger, whose marker
-- ("slotted:<pattern>" in the rules) tells the daemons to release it
-- should the rule go. Ledger entries a day past their slot are dropped
-- (a cancelled envelope's; one claimed after a longer outage gets a new
-- slot).
-- Returns {now ms, then per id its slot ms (now or earlier: deliver now)}.
-- Without the shard prelude. Allowed over maxmemory: it holds envelopes
-- back, and their deliveries are what frees memory.
local state, ledger, counts, rules = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
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
-- How late in µs a delivery may go after the one before without counting
-- as bunched: the spread of claims' own lateness.
local slack = 10000
local tat, sent = 0, 0
local st = redis.call('GET', state)
if st then
  local a, b = string.match(st, '^(%d+) (%d+)')
  tat, sent = tonumber(a) or 0, tonumber(b) or 0
end
tat = math.max(tat, nowus)
redis.call('ZREMRANGEBYSCORE', ledger, '-inf', string.format('(%d', now - 86400000))
local ids = {}
for i = 2, #ARGV, 2 do ids[#ids+1] = ARGV[i] end
local have = {}
for i = 1, #ids, 512 do
  local part = redis.call('ZMSCORE', ledger, unpack(ids, i, math.min(i + 511, #ids)))
  for j = 1, #part do have[#have+1] = part[j] end
end
-- go: whether a delivery now fits the deliveries let go so far (and if
-- so counts it), or else the first moment one fits, in ms, counted.
local function go()
  local fits = sent - tolerance - slack
  if fits <= nowus then
    sent = math.max(sent, nowus) + interval
    return true
  end
  sent = sent + interval
  return false, math.ceil(fits / 1000)
end
local held, granted, going = {}, {}, 0
for i, id in ipairs(ids) do
  local score, due = tonumber(have[i]), tonumber(ARGV[2 * i + 1]) or 0
  local slot = score and math.floor(score)
  if slot and slot >= due then
    if slot > now then
      out[#out+1] = slot
    elseif score ~= slot then
      out[#out+1] = slot
      granted[#granted+1] = id
      going = going + 1
    else
      local ok, ms = go()
      if ok then
        out[#out+1] = slot
        granted[#granted+1] = id
        going = going + 1
      else
        out[#out+1] = ms
        held[#held+1] = ms + 0.5
        held[#held+1] = id
      end
    end
  else
    local us = math.max(nowus, tat - tolerance, sent - tolerance - slack)
    tat = math.max(tat, us) + interval
    -- In whole ms, rounded up: never before the slot.
    local ms = now
    if us > nowus then ms = math.ceil(us / 1000) end
    if ms <= now and go() then
      out[#out+1] = now
      going = going + 1
      if score then granted[#granted+1] = id end
    else
      ms = math.max(ms, now + 1)
      out[#out+1] = ms
      held[#held+1] = ms
      held[#held+1] = id
    end
  end
end
redis.call('SET', state, string.format('%d %d', tat, sent))
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
