package admin

import (
	"sync"
	"time"
)

// recent keeps the last few minutes of deliveries in 10 s buckets, for the
// console's delivery-rate chart and per-target counts. Memory is bounded:
// 30 buckets, and at most maxTargets targets per bucket.
type recent struct {
	mu      sync.Mutex
	buckets [30]bucket
}

type bucket struct {
	start   int64 // unix seconds, multiple of 10
	total   int
	targets map[string]int
}

const maxTargets = 1000

func (r *recent) add(target string, now time.Time) {
	sec := now.Unix() / 10 * 10
	r.mu.Lock()
	defer r.mu.Unlock()
	b := &r.buckets[(sec/10)%int64(len(r.buckets))]
	if b.start != sec {
		*b = bucket{start: sec, targets: map[string]int{}}
	}
	b.total++
	if _, ok := b.targets[target]; ok || len(b.targets) < maxTargets {
		b.targets[target]++
	}
}

// RatePoint is the deliveries in one 10 s bucket.
type RatePoint struct {
	Start int64 `json:"start"`
	Count int   `json:"count"`
}

// snapshot returns the buckets of the last 5 minutes, oldest first, and the
// deliveries per target over them.
func (r *recent) snapshot(now time.Time) ([]RatePoint, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := now.Unix() / 10 * 10
	points := make([]RatePoint, len(r.buckets))
	targets := map[string]int{}
	for i := range points {
		start := cur - int64(len(r.buckets)-1-i)*10
		points[i].Start = start
		b := r.buckets[(start/10)%int64(len(r.buckets))]
		if b.start == start {
			points[i].Count = b.total
			for t, n := range b.targets {
				targets[t] += n
			}
		}
	}
	return points, targets
}
