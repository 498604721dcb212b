package scanner

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/store"
)

// CheckStore is what the background consistency check needs.
type CheckStore interface {
	Check(ctx context.Context, shard int, o store.CheckOptions) (map[string]int, error)
}

// CheckObserver counts what the check finds.
type CheckObserver interface {
	Inconsistent(kind string, n int)
}

// Checker walks the shards this daemon owns, one at a time and slowly, and
// reports data that breaks the store's invariants (delayd doctor's check,
// read-only). Nothing should ever be found: a finding is a bug or a change
// made behind delayd's back, and `delayd doctor --repair` fixes it.
type Checker struct {
	st       CheckStore
	sc       *Scanner
	obs      CheckObserver
	interval time.Duration
	log      hclog.Logger
}

// NewChecker checks one owned shard every interval. A nil obs counts
// nothing.
func NewChecker(st CheckStore, sc *Scanner, obs CheckObserver, interval time.Duration, log hclog.Logger) *Checker {
	if obs == nil {
		obs = nopCheckObserver{}
	}
	return &Checker{st: st, sc: sc, obs: obs, interval: interval, log: log}
}

type nopCheckObserver struct{}

func (nopCheckObserver) Inconsistent(string, int) {}

// checkPause between pages keeps the check's share of Redis small.
const checkPause = 20 * time.Millisecond

// Run checks until ctx is done.
func (c *Checker) Run(ctx context.Context) error {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	next := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		owned := c.sc.Owned()
		if len(owned) == 0 {
			continue
		}
		shard := owned[next%len(owned)]
		next++
		found, err := c.st.Check(ctx, shard, store.CheckOptions{Pause: checkPause})
		if err != nil {
			if ctx.Err() == nil {
				c.log.Debug("consistency check failed", "shard", shard, "error", err)
			}
			continue
		}
		for _, kind := range store.Kinds(found) {
			c.obs.Inconsistent(kind, found[kind])
			c.log.Warn("inconsistent data found; run delayd doctor --repair", "shard", shard, "kind", kind, "count", found[kind])
		}
	}
}
