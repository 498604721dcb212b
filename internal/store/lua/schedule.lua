-- schedule upserts a batch of envelopes (Schedule, store.go). KEYS hold
-- the 9 keys of each shard the batch touches, shard after shard (one shard
-- under Redis Cluster, where a script must stay in one slot; any number on
-- a single Redis, so a whole intake batch is one call).
-- ARGV[1] is the one-shot mark of the value format to write (value.go),
-- ARGV[2] how long to remember a stream message (ms), ARGV[3] how long a
-- delivered id's tombstone answers a resend (ms after its due time; 0:
-- never), ARGV[4] unused, then per envelope 7 values: k (KEYS
-- offset of its shard: 0, 9, 18...), id, mode, microseconds, value,
-- stream message ("" for none) and the request's fingerprint ("" for none): with mode "d" (delay)
-- or "e" (delay, the first occurrence of a series) the µs are from now and
-- the value is the encoded envelope, which the script stamps with the
-- value header; with mode "v" the µs are since the epoch and the value is
-- stamped already (the client knows the due time, and building a string in
-- Lua costs about as much as the rest of the upsert).
-- Returns the due time in ms of each envelope, or 0 for a stream message
-- this shard stored already (a redelivery after a lost ack: storing it
-- again would deliver it twice, or bring back an older version), or minus
-- the due time it had for a resend: an id whose tombstone (keys.go, done)
-- holds the same fingerprint within the window of its time was delivered
-- for this very request, and is not scheduled again, nor does it replace
-- a newer version stored since (docs/protocol.md, Resends). The
-- due time is rounded up to the millisecond so that a claim at "now ms" is
-- never early.
-- A replace drops any claim in flight for the id: the older delivery may
-- still go out, but its settle no longer matches a claim and changes nothing.
-- Not allowed to run over maxmemory: it is what fills Redis.

-- shard returns the keys of the shard at KEYS offset k.
local function shard(k)
  return KEYS[k+1], KEYS[k+2], KEYS[k+3], KEYS[k+4], KEYS[k+5], KEYS[k+6], KEYS[k+7], KEYS[k+8], KEYS[k+9]
end

local _, nowus = nowMs()
local nowms = math.floor(nowus / 1000)
local mark, window, remember = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

-- First every read (prelude: a key of the wrong type then fails the call
-- before any shard is written): what each envelope does, in ARGV order as
-- the writes below would see it. Per envelope j (ARGV from 7j - 2): ks[j]
-- its shard's KEYS offset, plan[j] 0 for a stream message stored already,
-- -due for a resend, nil to store. Tables are few: in Redis' Lua each
-- entry costs about as much as a command's own work (docs/BENCHMARKS.md).
local n = (#ARGV - 4) / 7
local ks, plan = {}, {}
-- stores: per KEYS offset, how many envelopes the call stores there. The
-- first perId ids a shard stores are read (HEXISTS: a replace touches
-- more keys); past that the keys a replace touches are checked instead,
-- which is then cheaper. replaces: a shard where an id read is stored.
local perId = 5
local stores, replaces = {}, {}
-- The ids stored, and per shard the stream messages remembered, by an
-- earlier envelope (an id has one shard; a message's envelopes may not).
local storing, remembering = {}, {}
for j = 1, n do
  local i = 7 * j - 2
  local k = tonumber(ARGV[i])
  ks[j] = k
  local data = KEYS[k + 3]
  local id = ARGV[i+1]
  local msg = ARGV[i+5]
  local fp = ARGV[i+6]
  local again, resent = false, nil
  if fp ~= '' and remember > 0 then
    local was = redis.call('ZSCORE', KEYS[k + 9], fp .. id)
    if was and tonumber(was) + remember >= nowms then
      -- Answered with the due time it had: a Delayd-At's is its own (the
      -- same request names the same time; the tombstone's time is when it
      -- was accepted, if later), a delay's is the tombstone's. Whatever is
      -- stored for the id is left alone: the ack that wrote the tombstone
      -- deleted this request's version, so a version stored now is a newer
      -- request, already answered, that a resend of an older one must not
      -- drop.
      resent = tonumber(was)
      if ARGV[i+2] == 'v' then resent = math.max(math.ceil(tonumber(ARGV[i+3]) / 1000), 1) end
    end
  end
  local mine = nil
  if msg ~= '' then
    mine = remembering[k]
    if not mine then
      mine = {}
      remembering[k] = mine
    end
    -- One that expired by now is pruned below, before it could be found.
    local expiry = redis.call('ZSCORE', KEYS[k + 8], msg)
    again = mine[msg] or (expiry and tonumber(expiry) > nowms)
  end
  if again then
    plan[j] = 0
  elseif resent then
    plan[j] = -resent
  else
    if mine then mine[msg] = true end
    local c = (stores[k] or 0) + 1
    stores[k] = c
    if c <= perId then
      if storing[id] or redis.call('HEXISTS', data, id) == 1 then replaces[k] = true end
    end
    storing[id] = true
  end
end
-- The keys a store writes unread: due (the new place), data
-- past perId, and those of a replace.
for k, c in pairs(stores) do
  if c > perId then
    checkKeys(k, 'due', 'data', 'attempts', 'errors', 'inflight', 'dead')
  elseif replaces[k] then
    checkKeys(k, 'due', 'attempts', 'errors', 'inflight', 'dead')
  else
    checkKeys(k, 'due')
  end
end

local out, pruned = {}, {}
for j = 1, n do
  local i, k = 7 * j - 2, ks[j]
  local due, inflight, data, attempts, dead, errors, _, seen = shard(k)
  local id = ARGV[i+1]
  local msg = ARGV[i+5]
  if msg ~= '' and not pruned[k] then
    redis.call('ZREMRANGEBYSCORE', seen, '-inf', nowms)
    pruned[k] = true
  end
  if plan[j] then
    out[#out+1] = plan[j]
  else
    local us = tonumber(ARGV[i+3])
    local mode = ARGV[i+2]
    if mode ~= 'v' then us = nowus + us end
    -- At least 1: 0 means "stored already" in the reply.
    local dueMs = math.max(math.ceil(us / 1000), 1)
    -- Adds first, then removals: a cut leaves the id indexed twice, never
    -- unindexed.
    redis.call('ZADD', due, ms(dueMs), id)
    local v = ARGV[i+4]
    if mode == 'd' then
      v = stamp(dueMs, 0, v, mark)
    elseif mode == 'e' then
      v = stamp(dueMs, 1, v, mark)
    end
    if redis.call('HSETNX', data, id, v) == 0 then
      redis.call('HSET', data, id, v)
      -- A replace: forget any claim, error or death of the old one.
      redis.call('HDEL', attempts, id)
      redis.call('HDEL', errors, id)
      redis.call('ZREM', inflight, id)
      redis.call('ZREM', dead, id)
    end
    -- Remembered last: a cut before it stores the message again on
    -- redelivery, which redoes the replace's removals too.
    if msg ~= '' then redis.call('ZADD', seen, nowms + window, msg) end
    out[#out+1] = dueMs
  end
end
return out
