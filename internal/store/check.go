package store

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// checkScript checks one page of one shard against the invariants stated in
// scripts.go, atomically, so it is safe while daemons deliver: every script
// keeps the invariants within one call, and this sees each id between calls.
// ARGV[1] phase: "data" (scan data: each id indexed exactly once) or 1..6,
// a KEYS index of a set or hash whose members must have data; ARGV[2] the
// SCAN cursor; ARGV[3] the page size; ARGV[4] "1" to repair what it finds.
// Repairs: data without an index is due now (delivered rather than lost);
// an id in several indexes keeps the first of inflight, due, dead; index,
// claims and errors entries without data are dropped.
// Returns {next cursor, then kind, count pairs}.
var checkScript = newScript("allow-oom", `
local bad = checkKeys()
if bad then return redis.error_reply(bad) end
local now = nowMs()
local phase, repair = ARGV[1], ARGV[4] == '1'
local found = {}
local function add(kind, n) found[kind] = (found[kind] or 0) + n end
local out
if phase == 'data' then
  local r = redis.call('HSCAN', KEYS[3], ARGV[2], 'COUNT', tonumber(ARGV[3]))
  out = {r[1]}
  for i = 1, #r[2], 2 do
    local id = r[2][i]
    local inf = redis.call('ZSCORE', KEYS[2], id)
    local due = redis.call('ZSCORE', KEYS[1], id)
    local dead = redis.call('ZSCORE', KEYS[5], id)
    local n = (inf and 1 or 0) + (due and 1 or 0) + (dead and 1 or 0)
    if n == 0 then
      add('unindexed_data', 1)
      if repair then redis.call('ZADD', KEYS[1], now, id) end
    elseif n > 1 then
      add('multiply_indexed', 1)
      if repair then
        if inf then redis.call('ZREM', KEYS[1], id) end
        if inf or due then redis.call('ZREM', KEYS[5], id) end
      end
    end
    if inf and not string.find(inf, '.', 1, true) and
        not string.match(redis.call('HGET', KEYS[4], id) or '', '^%d+:[^:]*:.+$') then
      -- A lease score without a token (nor an older version's claim with
      -- one): settles cannot match it, but the lease expires and the
      -- next claim writes a new one: report only.
      add('inflight_without_claim', 1)
    end
  end
else
  local k = tonumber(phase)
  local names = {'due_without_data', 'inflight_without_data', '', 'claim_without_data', 'dead_without_data', 'error_without_data'}
  local r
  if kinds[k] == 'zset' then
    r = redis.call('ZSCAN', KEYS[k], ARGV[2], 'COUNT', tonumber(ARGV[3]))
  else
    r = redis.call('HSCAN', KEYS[k], ARGV[2], 'COUNT', tonumber(ARGV[3]))
  end
  out = {r[1]}
  for i = 1, #r[2], 2 do
    local id = r[2][i]
    if redis.call('HEXISTS', KEYS[3], id) == 0 then
      add(names[k], 1)
      if repair then
        if kinds[k] == 'zset' then redis.call('ZREM', KEYS[k], id) else redis.call('HDEL', KEYS[k], id) end
      end
    end
  end
end
for kind, n in pairs(found) do
  out[#out+1] = kind
  out[#out+1] = n
end
return out
`)

// checkPhases are the passes of a shard check: data first, then every
// index and hash whose members need data (KEYS positions, see scripts.go).
var checkPhases = []string{"data", "1", "2", "5", "4", "6"}

// Inconsistency kinds found by Check.
const (
	KindUnindexedData        = "unindexed_data"
	KindMultiplyIndexed      = "multiply_indexed"
	KindInflightWithoutClaim = "inflight_without_claim"
	KindDueWithoutData       = "due_without_data"
	KindInflightWithoutData  = "inflight_without_data"
	KindDeadWithoutData      = "dead_without_data"
	KindClaimWithoutData     = "claim_without_data"
	KindErrorWithoutData     = "error_without_data"
)

// AllKinds lists every kind Check reports.
var AllKinds = []string{KindUnindexedData, KindMultiplyIndexed, KindInflightWithoutClaim, KindDueWithoutData,
	KindInflightWithoutData, KindDeadWithoutData, KindClaimWithoutData, KindErrorWithoutData}

// CheckOptions pace a check.
type CheckOptions struct {
	// Repair fixes what is found (see checkScript); otherwise read-only.
	Repair bool
	// Page is how many entries one atomic step looks at (default 200).
	Page int
	// Pause between steps keeps a background check light on Redis.
	Pause time.Duration
}

// Check walks one shard and returns the inconsistencies found, by kind.
// It is safe while daemons deliver: each page is checked atomically.
func (s *Store) Check(ctx context.Context, shard int, o CheckOptions) (map[string]int, error) {
	if o.Page <= 0 {
		o.Page = 200
	}
	repair := "0"
	if o.Repair {
		repair = "1"
	}
	found := map[string]int{}
	for _, phase := range checkPhases {
		cursor := "0"
		for {
			raw, err := s.run(ctx, checkScript, s.keys[shard].list(), phase, cursor, o.Page, repair).Slice()
			if err != nil {
				return found, fmt.Errorf("store: check shard %d: %w", shard, err)
			}
			if len(raw) < 1 || len(raw)%2 != 1 {
				return found, fmt.Errorf("store: check shard %d: malformed reply", shard)
			}
			cursor, _ = raw[0].(string)
			for i := 1; i < len(raw); i += 2 {
				kind, _ := raw[i].(string)
				found[kind] += int(asInt(raw[i+1]))
			}
			if cursor == "0" || cursor == "" {
				break
			}
			if o.Pause > 0 {
				t := time.NewTimer(o.Pause)
				select {
				case <-ctx.Done():
					t.Stop()
					return found, ctx.Err()
				case <-t.C:
				}
			}
		}
	}
	return found, nil
}

// Kinds returns the kinds of found in a stable order.
func Kinds(found map[string]int) []string {
	out := make([]string, 0, len(found))
	for k := range found {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
