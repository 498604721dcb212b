package store

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// checkPhases are the passes of a shard check: data first, then every
// index and hash whose members need data, by key name (lua/check.lua).
var checkPhases = []string{"data", "due", "inflight", "dead", "attempts", "errors"}

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
	found := map[string]int{}
	for _, phase := range checkPhases {
		cursor := "0"
		for {
			r := exec1(ctx, s, checkOp, checkArgs{shard: &s.keys[shard], phase: phase, cursor: cursor, page: o.Page,
				repair: o.Repair})
			reply, err := r.reply, r.err
			if err != nil {
				return found, fmt.Errorf("store: check shard %d: %w", shard, err)
			}
			cursor = reply.cursor
			for kind, n := range reply.found {
				found[kind] += n
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
