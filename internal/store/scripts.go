package store

import "github.com/redis/go-redis/v9"

// Every script takes the same KEYS, in this order:
//   KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] data HASH,
//   KEYS[4] attempts HASH, KEYS[5] dead ZSET, KEYS[6] errors HASH
// and reads "now" from Redis TIME, so daemons with skewed clocks agree.
// Stored values carry an 8-byte version at bytes 2..9 (see envelope.Encode).

// scheduleScript upserts a batch of envelopes. KEYS hold the six keys of
// each shard the batch touches, shard after shard (one shard under Redis
// Cluster, where a script must stay in one slot; any number on a single
// Redis, so a whole intake batch is one call).
// ARGV: per envelope 5 values: k (KEYS offset of its shard: 0, 6, 12...),
// id, mode ("a" absolute | "d" delay), microseconds (since the epoch for "a",
// from now for "d"), encoded data.
// Returns the due time in ms of each envelope. The due time is rounded up
// to the millisecond so that a claim at "now ms" is never early.
// A replace drops any claim in flight for the id: the older delivery may
// still go out, but its ack no longer matches the version and deletes nothing.
var scheduleScript = redis.NewScript(`
local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i = 1, #ARGV, 5 do
  local k = tonumber(ARGV[i])
  local id = ARGV[i+1]
  local us = tonumber(ARGV[i+3])
  if ARGV[i+2] == 'd' then us = nowus + us end
  local due = math.ceil(us / 1000)
  redis.call('ZADD', KEYS[k+1], due, id)
  if redis.call('HSET', KEYS[k+3], id, ARGV[i+4]) == 0 then
    -- A replace: forget any claim, attempts, error or death of the old one.
    redis.call('ZREM', KEYS[k+2], id)
    redis.call('ZREM', KEYS[k+5], id)
    redis.call('HDEL', KEYS[k+4], id)
    redis.call('HDEL', KEYS[k+6], id)
  end
  out[#out+1] = due
end
return out
`)

// cancelScript removes envelopes wherever they are: ARGV are ids.
// With ARGV[1] == "" it only removes ids found in the dead set (purge).
// Returns how many existed.
var cancelScript = redis.NewScript(`
local n = 0
local deadOnly = ARGV[1] == ''
local first = 1
if deadOnly then first = 2 end
for i = first, #ARGV do
  local id = ARGV[i]
  if not deadOnly or redis.call('ZSCORE', KEYS[5], id) then
    n = n + redis.call('HDEL', KEYS[3], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
  end
end
return n
`)

// claimScript moves up to ARGV[1] envelopes whose due time has passed from
// due to inflight with a lease of ARGV[2] ms, counting the attempt.
// Returns {now µs, next due ms or -1, next lease expiry ms or -1, number of
// due ids that had no data (removed behind delayd's back), then per
// envelope: id, original due ms, attempt, data}. "now" is in µs so the
// scanner can time its next wake-up to better than a millisecond.
var claimScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = now + tonumber(ARGV[2])
local out = {tonumber(t[1]) * 1000000 + tonumber(t[2]), -1, -1, 0}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local n = #ids / 2
if n > 0 then
  -- The claimed ids are the n lowest of the set: one command removes them,
  -- and every other step below is one command for the whole batch.
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - 1)
  local members = {}
  for i = 1, #ids, 2 do members[#members+1] = ids[i] end
  local datas = redis.call('HMGET', KEYS[3], unpack(members))
  local prevs = redis.call('HMGET', KEYS[4], unpack(members))
  local att, inflight = {}, {}
  for j, id in ipairs(members) do
    local data = datas[j]
    if data then
      local attempt, due = 1, ids[2*j]
      local prev = prevs[j]
      if prev then
        local sep = string.find(prev, ':', 1, true)
        attempt = tonumber(string.sub(prev, 1, sep - 1)) + 1
        due = string.sub(prev, sep + 1)
      end
      att[#att+1] = id
      att[#att+1] = attempt .. ':' .. due
      inflight[#inflight+1] = lease
      inflight[#inflight+1] = id
      out[#out+1] = id
      out[#out+1] = due
      out[#out+1] = attempt
      out[#out+1] = data
    else
      out[4] = out[4] + 1
    end
  end
  if #att > 0 then
    redis.call('HSET', KEYS[4], unpack(att))
    redis.call('ZADD', KEYS[2], unpack(inflight))
  end
end
local nd = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nd > 0 then out[2] = tonumber(nd[2]) end
local nl = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #nl > 0 then out[3] = tonumber(nl[2]) end
return out
`)

// ackScript settles delivered envelopes. ARGV[1] is the retry delay in ms
// for releases, then per envelope 4 values: id, version (8 bytes), op, error.
// Ops: "a" ack (delivered: delete), "r" release (back to due after the
// retry delay), "u" unreachable (like "r", but the attempt is not counted:
// the target was never reached), "d" dead (to the dead set). A non-empty
// error is recorded.
// An entry whose stored version differs was replaced meanwhile and is left
// alone. Returns the number settled.
var ackScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = {}
for i = 2, #ARGV, 4 do ids[#ids+1] = ARGV[i] end
if #ids == 0 then return 0 end
local datas = redis.call('HMGET', KEYS[3], unpack(ids))
local settled, acked, errs, again, dead, deadIds = {}, {}, {}, {}, {}, {}
for j, id in ipairs(ids) do
  local k = 2 + (j - 1) * 4
  local data = datas[j]
  if data and string.sub(data, 2, 9) == ARGV[k+1] then
    local op = ARGV[k+2]
    settled[#settled+1] = id
    if op == 'a' then
      acked[#acked+1] = id
    else
      if ARGV[k+3] ~= '' then
        errs[#errs+1] = id
        errs[#errs+1] = ARGV[k+3]
      end
      if op == 'u' then
        -- Not an attempt (the way to the target was down): uncount it.
        local prev = redis.call('HGET', KEYS[4], id)
        if prev then
          local sep = string.find(prev, ':', 1, true)
          local a = math.max(tonumber(string.sub(prev, 1, sep - 1)) - 1, 0)
          redis.call('HSET', KEYS[4], id, a .. string.sub(prev, sep))
        end
      end
      if op == 'r' or op == 'u' then
        again[#again+1] = now + tonumber(ARGV[1])
        again[#again+1] = id
      else
        dead[#dead+1] = now
        dead[#dead+1] = id
        deadIds[#deadIds+1] = id
      end
    end
  end
end
if #settled > 0 then redis.call('ZREM', KEYS[2], unpack(settled)) end
if #acked > 0 then
  redis.call('ZREM', KEYS[1], unpack(acked))
  redis.call('HDEL', KEYS[3], unpack(acked))
  redis.call('HDEL', KEYS[4], unpack(acked))
  redis.call('HDEL', KEYS[6], unpack(acked))
end
if #errs > 0 then redis.call('HSET', KEYS[6], unpack(errs)) end
if #again > 0 then redis.call('ZADD', KEYS[1], unpack(again)) end
if #dead > 0 then
  redis.call('ZREM', KEYS[1], unpack(deadIds))
  redis.call('ZADD', KEYS[5], unpack(dead))
end
return #settled
`)

// reapScript returns up to ARGV[1] envelopes whose lease expired (their
// daemon died or stalled) to due at once. The attempt count stays, so the
// scanner sends them to dead once they reach the limit. Returns the number.
var reapScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZADD', KEYS[1], now, id)
end
return #ids
`)

// replayScript moves dead envelopes (ARGV: ids) back to due at once with a
// fresh attempt count. Returns how many were dead.
var replayScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = 0
for _, id in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[5], id) == 1 then
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('ZADD', KEYS[1], now, id)
    n = n + 1
  end
end
return n
`)

var allScripts = []*redis.Script{scheduleScript, cancelScript, claimScript, ackScript, reapScript, replayScript, heartbeatScript, ownScript}
