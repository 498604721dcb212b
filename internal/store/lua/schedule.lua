-- schedule upserts a batch of envelopes (Schedule, store.go) of any number
-- of shards (one a call under Redis Cluster). KEYS are the first shard's,
-- for Cluster to route the call; every shard's keys are named from its tag
-- in ARGV (a key in KEYS costs Redis more than its name in a string).
-- ARGV[1] is the one-shot mark of the value format to write (value.go),
-- ARGV[2] how long to remember a stream message (ms), ARGV[3] how long a
-- delivered id's tombstone answers a resend (ms after its due time; 0:
-- never), then per shard touched its key tag k ("{<ns>:<shard>}:"), the
-- number of its envelopes, the mode of them all ("" where they differ), w,
-- and per envelope w values: id, microseconds, value, the request's
-- fingerprint ("" for none), the stream message ("" for none) and the
-- mode; the fingerprint and message only where an envelope of the shard
-- carries one, the mode only where they differ (an argument costs Redis
-- as much as many steps of Lua). With mode "d" (delay) or "e" (delay, the
-- first occurrence of a series) the µs are from now and the value is the
-- encoded envelope, which the script stamps with the value header; with
-- mode "v" the µs are since the epoch and the value is stamped already
-- (the client knows the due time; building a value in Lua is the dearest
-- part of a store, so the header of each due time is built once).
-- Returns, per envelope in ARGV order, its due time in ms, or 0 for a
-- stream message this shard stored already (a redelivery after a lost
-- ack: storing it again would deliver it twice, or bring back an older
-- version), or minus the due time it had for a resend: an id whose
-- tombstone (keys.go, done) holds the same fingerprint within the window
-- of its time was delivered for this very request, and is not scheduled
-- again, nor does it replace a newer version stored since
-- (docs/protocol.md, Resends). The due time is rounded up to the
-- millisecond so that a claim at "now ms" is never early. An id named
-- twice is stored at its last version.
-- Per shard it costs what the floor's schedule does (one HSET data and one
-- ZADD due, variadic) and a few reads: one ZMSCORE of the tombstones of
-- the envelopes with a fingerprint, one of the stream messages, and the
-- sizes of the keys a replace clears. No id is read: a store that may be a
-- replace drops any claim, attempts, error and death of the old version
-- (the older delivery may still go out, but its settle no longer matches a
-- claim and changes nothing), with one removal of all the shard's stored
-- ids from each of those keys that is not empty.
-- Not allowed to run over maxmemory: it is what fills Redis.

local _, nowus = nowMs()
local nowms = math.floor(nowus / 1000)
local mark, window, remember = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

-- out[j]: the answer of the j-th envelope, its due time while it is to be
-- stored. Per shard, in ARGV order: k its key tag, from and to the
-- ARGV offsets of its first and last envelope, w their width, mode theirs
-- ("" where each has its own, last), j the index in out before its first;
-- fp the tombstone members to look up and msg the stream messages, where
-- any envelope carries one. Tables are few, and no C function is called
-- per envelope: in Redis' Lua each costs about as much as a command's own
-- work (docs/BENCHMARKS.md).
local out, n, shards = {}, 0, {}
local i = 4
while i <= #ARGV do
  local from, mode, w = i + 4, ARGV[i + 2], tonumber(ARGV[i + 3])
  -- cols: the values of an envelope besides its mode
  local cols = w
  if mode == '' then cols = w - 1 end
  local g = {k = ARGV[i], from = from, to = from + w * (ARGV[i + 1] - 1), w = w, mode = mode, j = n}
  shards[#shards + 1] = g
  for e = from, g.to, w do
    local m = mode
    if m == '' then m = ARGV[e + w - 1] end
    -- The µs rounded up to ms, at least 1 (0 means "stored already" in
    -- the reply), in arithmetic, which reads the string as a number.
    local us = ARGV[e + 1] + 999
    if m ~= 'v' then us = us + nowus end
    local due = (us - us % 1000) / 1000
    if due < 1 then due = 1 end
    n = n + 1
    out[n] = due
    local fp, msg = '', ''
    if cols > 3 then
      fp = ARGV[e + 3]
      if cols > 4 then msg = ARGV[e + 4] end
    end
    if fp ~= '' and remember > 0 then
      local l = g.fp or {}
      g.fp = l
      l[#l + 1] = fp .. ARGV[e]
    end
    if msg ~= '' then
      local l = g.msg or {}
      g.msg = l
      l[#l + 1] = msg
    end
  end
  i = g.to + w
end

-- Then every read, of every shard, before the first write (prelude: a key
-- of the wrong type then fails the call having written nothing).
for _, g in ipairs(shards) do
  local k = g.k
  if g.fp then
    local was, x, j = many('ZMSCORE', k .. 'done', g.fp), 0, g.j
    for e = g.from, g.to, g.w do
      j = j + 1
      if ARGV[e + 3] ~= '' then
        x = x + 1
        local t = was[x] and tonumber(was[x])
        if t and t + remember >= nowms then
          -- Answered with the due time it had: a Delayd-At's is its own
          -- (the same request names the same time; the tombstone's time
          -- is when it was accepted, if later), a delay's is the
          -- tombstone's. Whatever is stored for the id is left alone: the
          -- ack that wrote the tombstone deleted this request's version,
          -- so a version stored now is a newer request, already answered,
          -- that a resend of an older one must not drop.
          local m = g.mode
          if m == '' then m = ARGV[e + g.w - 1] end
          if m == 'v' then out[j] = -out[j] else out[j] = -t end
        end
      end
    end
  end
  if g.msg then
    -- One that expired by now is pruned below, before it could be found.
    local exp, x, j, mine = many('ZMSCORE', k .. 'seen', g.msg), 0, g.j, {}
    for e = g.from, g.to, g.w do
      j = j + 1
      local msg = ARGV[e + 4]
      if msg ~= '' then
        x = x + 1
        if mine[msg] or (exp[x] and tonumber(exp[x]) > nowms) then
          out[j] = 0
        elseif out[j] > 0 then
          mine[msg] = true
        end
      end
    end
  end
  for j = g.j + 1, g.j + (g.to - g.from) / g.w + 1 do
    if out[j] > 0 then
      g.stores = true
      break
    end
  end
  if g.stores then
    -- The call's first write (data, below) fails by itself.
    if g ~= shards[1] then redis.call('HLEN', k .. 'data') end
    redis.call('ZCARD', k .. 'due')
    g.inflight = redis.call('ZCARD', k .. 'inflight') > 0
    g.dead = redis.call('ZCARD', k .. 'dead') > 0
    g.attempts = redis.call('HLEN', k .. 'attempts') > 0
    g.errors = redis.call('HLEN', k .. 'errors') > 0
  end
end

-- heads: value headers by due ms (negated for a series' first
-- occurrence); scores: due ms as ZADD takes them.
local heads, scores = {}, {}
-- The writes, shard by shard: adds first, removals last (prelude), the
-- stream messages remembered last of all: a cut before it stores the
-- message again on redelivery, which redoes the removals too.
for _, g in ipairs(shards) do
  local k = g.k
  if g.stores then
    local h, z, c, j = {}, {}, 0, g.j
    -- ids: the stored ids, for the removals of a replace, where needed.
    local ids = (g.inflight or g.dead or g.attempts or g.errors) and {}
    for e = g.from, g.to, g.w do
      j = j + 1
      local due = out[j]
      if due > 0 then
        local id, v, mode = ARGV[e], ARGV[e + 2], g.mode
        if mode == '' then mode = ARGV[e + g.w - 1] end
        if mode ~= 'v' then
          -- The header of each due time (and series or not) is built once:
          -- a call's delays are often the same.
          local at = due
          if mode == 'e' then at = -due end
          local head = heads[at]
          if not head then
            head = stamp(due, mode == 'e' and 1 or 0, '', mark)
            heads[at] = head
          end
          v = head .. v
        end
        c = c + 1
        if ids then ids[c] = id end
        h[2 * c - 1], h[2 * c] = id, v
        -- Formatted here, once per due time: a Lua number argument would
        -- be formatted as a float.
        local score = scores[due]
        if not score then
          score = string.format('%d', due)
          scores[due] = score
        end
        z[2 * c - 1], z[2 * c] = score, id
      end
    end
    chunks('HSET', k .. 'data', h)
    chunks('ZADD', k .. 'due', z)
    if g.inflight then chunks('ZREM', k .. 'inflight', ids) end
    if g.dead then chunks('ZREM', k .. 'dead', ids) end
    if g.attempts then chunks('HDEL', k .. 'attempts', ids) end
    if g.errors then chunks('HDEL', k .. 'errors', ids) end
  end
  if g.msg then
    local seen = k .. 'seen'
    redis.call('ZREMRANGEBYSCORE', seen, '-inf', nowms)
    local expiry, z, j = string.format('%d', nowms + window), {}, g.j
    for e = g.from, g.to, g.w do
      j = j + 1
      if ARGV[e + 4] ~= '' and out[j] > 0 then
        z[#z + 1] = expiry
        z[#z + 1] = ARGV[e + 4]
      end
    end
    chunks('ZADD', seen, z)
  end
end
return out
