-- schedule upserts a batch of envelopes (Schedule, store.go). KEYS hold
-- the 10 keys of each shard the batch touches, shard after shard (one shard
-- under Redis Cluster, where a script must stay in one slot; any number on
-- a single Redis, so a whole intake batch is one call).
-- ARGV[1] is the one-shot mark of the value format to write (value.go),
-- ARGV[2] how long to remember a stream message (ms), ARGV[3] how long a
-- delivered id's tombstone answers a resend (ms after its due time; 0:
-- never), ARGV[4] "1" to index new envelopes in the due buckets (format 4,
-- prelude), "0" in the due set, then per envelope 7 values: k (KEYS
-- offset of its shard: 0, 10, 20...), id, mode, microseconds, value,
-- stream message ("" for none) and the request's fingerprint ("" for none): with mode "d" (delay)
-- or "e" (delay, the first occurrence of a series) the µs are from now and
-- the value is the encoded envelope, which the script stamps with the
-- value header; with mode "v" the µs are since the epoch and the value is
-- stamped already (the client knows the due time, and building a string in
-- Lua costs about as much as the rest of the upsert).
-- Returns the due time in ms of each envelope, or 0 for a stream message
-- this shard stored already (a redelivery after a lost ack: storing it
-- again would deliver it twice, or bring back an older version), or minus
-- the due time it had for a resend: an id that is not stored, whose
-- tombstone (keys.go, done) holds the same fingerprint within the window
-- of its time,
-- was delivered for this very request, and is not scheduled again. The
-- due time is rounded up to the millisecond so that a claim at "now ms" is
-- never early.
-- A replace drops any claim in flight for the id: the older delivery may
-- still go out, but its settle no longer matches a claim and changes nothing.
-- Not allowed to run over maxmemory: it is what fills Redis.

-- shard returns the keys of the shard at KEYS offset k.
local function shard(k)
  return KEYS[k+1], KEYS[k+2], KEYS[k+3], KEYS[k+4], KEYS[k+5], KEYS[k+6], KEYS[k+7], KEYS[k+8], KEYS[k+9], KEYS[k+10]
end

local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local _, nowus = nowMs()
local nowms = math.floor(nowus / 1000)
local mark, window, remember = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local buckets = ARGV[4] == '1'
local out, pruned = {}, {}
for i = 5, #ARGV, 7 do
  local k = tonumber(ARGV[i])
  local due, inflight, data, attempts, dead, errors, _, seen, done, pending = shard(k)
  local id = ARGV[i+1]
  local msg = ARGV[i+5]
  local fp = ARGV[i+6]
  local again = false
  local resent = nil
  if fp ~= '' and remember > 0 then
    local was = redis.call('ZSCORE', done, fp .. id)
    if was and tonumber(was) + remember >= nowms and redis.call('HEXISTS', data, id) == 0 then
      -- Answered with the due time it had: a Delayd-At's is its own
      -- (the same request names the same time; the tombstone's time is
      -- when it was accepted, if later), a delay's is the tombstone's.
      resent = tonumber(was)
      if ARGV[i+2] == 'v' then resent = math.max(math.ceil(tonumber(ARGV[i+3]) / 1000), 1) end
    end
  end
  if msg ~= '' then
    if not pruned[k] then
      redis.call('ZREMRANGEBYSCORE', seen, '-inf', nowms)
      pruned[k] = true
    end
    again = redis.call('ZSCORE', seen, msg)
  end
  if again then
    out[#out+1] = 0
  elseif resent then
    out[#out+1] = -resent
  else
    local us = tonumber(ARGV[i+3])
    local mode = ARGV[i+2]
    if mode ~= 'v' then us = nowus + us end
    -- At least 1: 0 means "stored already" in the reply.
    local dueMs = math.max(math.ceil(us / 1000), 1)
    -- Adds first, then removals: a cut leaves the id indexed twice, never
    -- unindexed.
    local m
    if buckets then
      m = bucketAdd(pending, dueMs, id)
    else
      redis.call('ZADD', due, ms(dueMs), id)
    end
    local v = ARGV[i+4]
    if mode == 'd' then
      v = stamp(dueMs, 0, v, mark)
    elseif mode == 'e' then
      v = stamp(dueMs, 1, v, mark)
    end
    -- A new id is stored at once; a replace reads the version it replaces
    -- first, to find its bucket (by its due time: the add above can only
    -- have moved the first bucket's bound down, which keeps it found).
    if redis.call('HSETNX', data, id, v) == 0 then
      local was = bucketed(pending, redis.call('HGET', data, id), id)
      redis.call('HSET', data, id, v)
      -- A replace: forget any claim, error or death of the old one.
      redis.call('HDEL', attempts, id)
      redis.call('HDEL', errors, id)
      redis.call('ZREM', inflight, id)
      redis.call('ZREM', dead, id)
      if buckets then redis.call('ZREM', due, id) end
      if was and was ~= m then bucketRemove(pending, was, {id}) end
    end
    -- A bucket grown past bucketMax splits once the id is in its one place,
    -- so none ever holds more than bucketMax + 1.
    if m then bucketSplit(pending, m, id) end
    -- Remembered last: a cut before it stores the message again on
    -- redelivery, which redoes the replace's removals too.
    if msg ~= '' then redis.call('ZADD', seen, nowms + window, msg) end
    out[#out+1] = dueMs
  end
end
countBuckets()
return out
