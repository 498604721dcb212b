-- Saves an intake stream's floor: the stream sequence up to which every
-- message of the stream was settled (stored, refused, or found stored
-- already), as its consumer's ack floor said. A consumer created again
-- starts after it (internal/bridge/stream.go).
-- KEYS[1] {ns:members}:intake  HASH stream name -> "<created>/<floor>"
-- ARGV[1] stream name
-- ARGV[2] the stream's creation time, ns since the epoch, decimal
-- ARGV[3] floor
-- Reply: 1 saved; 0 kept: the same stream's floor is as high already, or
-- the field holds a newer stream of that name (a daemon still bound to a
-- deleted one must not take it back).
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local created, floor = string.match(cur, '^(%d+)/(%d+)$')
  if created == ARGV[2] then
    if tonumber(floor) >= tonumber(ARGV[3]) then return 0 end
  elseif created and (#created > #ARGV[2] or (#created == #ARGV[2] and created > ARGV[2])) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '/' .. ARGV[3])
return 1
