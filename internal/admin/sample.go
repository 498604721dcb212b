package admin

import (
	"context"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/store"
)

// StatsSource is where the sampled gauges come from.
type StatsSource interface {
	Shards() int
	Stats(ctx context.Context, shards ...int) ([]store.ShardStats, int64, error)
	Owners(ctx context.Context) ([]string, error)
	Ready(ctx context.Context) error
}

// reporterShard is the shard whose owner also samples every shard for the
// fleet-wide gauges: exactly one daemon at a time, whichever it is.
const reporterShard = 0

// Sample refreshes the sampled gauges every interval until ctx is done.
// Each daemon reports the shards owned() returns, so Redis load stays flat
// as daemons are added and the fleet's total is the sum over daemons. The
// owner of shard 0 also reports every shard (backlog, unowned shards), so
// an unowned shard's backlog stays visible. One pipeline of ZCARDs and
// ZRANGE 0 0 per shard: never a scan.
func (m *Metrics) Sample(ctx context.Context, src StatsSource, owned func() []int, every time.Duration, log hclog.Logger) {
	m.shardsTotal.Set(float64(src.Shards()))
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		m.sampleOnce(ctx, src, owned(), log)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Metrics) sampleOnce(ctx context.Context, src StatsSource, owned []int, log hclog.Logger) {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	reporter := slices.Contains(owned, reporterShard)
	err := m.sampleShards(sctx, src, owned, reporter)
	if err == nil && reporter {
		err = m.sampleOwners(sctx, src)
	}
	m.sampleFlow(reporter && err == nil)
	if !reporter || err != nil {
		// Stale fleet-wide numbers would mislead; without them the
		// dashboard shows a gap and the alerts see the owner is missing.
		m.backlog.Reset()
		m.backlogOverdue.Reset()
		m.shardsUnowned.Reset()
	}
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		m.redisErrors.WithLabelValues(opSample).Inc()
		m.redisConnected.Set(0)
		log.Debug("sampling gauges failed", "error", err)
		return
	}
	m.redisConnected.Set(1)
}

// sampleShards sets the owned-shard gauges and, for the reporter, the
// backlog of every shard, from one Stats pipeline.
func (m *Metrics) sampleShards(ctx context.Context, src StatsSource, owned []int, reporter bool) error {
	if len(owned) == 0 {
		m.pending.Set(0)
		m.inflight.Set(0)
		m.dead.Set(0)
		m.oldestOverdue.Set(0)
		return src.Ready(ctx) // still tell whether Redis answers: one command
	}
	var shards []int // nil: every shard
	if !reporter {
		shards = owned
	}
	stats, nowMs, err := src.Stats(ctx, shards...)
	if err != nil {
		return err
	}
	var mine []store.ShardStats
	for _, s := range stats {
		if !reporter || slices.Contains(owned, s.Shard) {
			mine = append(mine, s)
		}
	}
	c, overdue := total(mine, nowMs)
	m.pending.Set(float64(c.Pending))
	m.inflight.Set(float64(c.Inflight))
	m.dead.Set(float64(c.Dead))
	m.oldestOverdue.Set(overdue)
	if reporter {
		c, overdue = total(stats, nowMs)
		m.backlog.WithLabelValues("pending").Set(float64(c.Pending))
		m.backlog.WithLabelValues("inflight").Set(float64(c.Inflight))
		m.backlog.WithLabelValues("dead").Set(float64(c.Dead))
		m.backlogOverdue.WithLabelValues().Set(overdue)
	}
	return nil
}

func (m *Metrics) sampleOwners(ctx context.Context, src StatsSource) error {
	owners, err := src.Owners(ctx)
	if err != nil {
		return err
	}
	n := 0
	for _, o := range owners {
		if o == "" {
			n++
		}
	}
	m.shardsUnowned.WithLabelValues().Set(float64(n))
	return nil
}

// total sums shard counts and returns how far past due (seconds) the
// earliest pending envelope is, 0 when none is.
func total(stats []store.ShardStats, nowMs int64) (store.Counts, float64) {
	var c store.Counts
	next := int64(-1)
	for _, s := range stats {
		c.Pending, c.Inflight, c.Dead = c.Pending+s.Counts.Pending, c.Inflight+s.Counts.Inflight, c.Dead+s.Counts.Dead
		if s.NextDueMs >= 0 && (next < 0 || s.NextDueMs < next) {
			next = s.NextDueMs
		}
	}
	if next >= 0 && next < nowMs {
		return c, float64(nowMs-next) / 1000
	}
	return c, 0
}
