package scanner

import (
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/recur"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// A jittered series: each occurrence is due in [base, base + jitter) at its
// own offset, and the bases are exactly the rule's, however many
// occurrences the offsets have moved. A late delivery catches up from the
// bases, until bounds the bases, and MaxDue the jittered times.
func TestJitteredSeries(t *testing.T) {
	t.Parallel()
	const (
		id     = "s"
		jitter = 20 * time.Second
		every  = time.Minute
	)
	base0 := int64(2_000_000_000_000) // ms
	off := func(k int64) int64 { return envelope.JitterOffset(id, k, jitter).Milliseconds() }
	clock := testutil.NewClock()
	s := newTestScanner(&claimStore{shards: 1}, newSwitchPub(), clock, outcomeOpts)
	nextJ := func(rule recur.Rule, jitter time.Duration, dueMs, redisNow, k int64) store.Settle {
		t.Helper()
		s.clock.set(redisNow*1000, clock.Now())
		d := envelope.Delivery{ID: id, Due: time.UnixMilli(dueMs), Attempt: 1, Occurrence: k,
			Envelope: envelope.Envelope{Target: "orders.x", Series: &rule, Jitter: jitter}}
		st, _ := s.outcome(claimed{Claimed: store.Claimed{ID: id, DueMs: dueMs, Attempt: 1, Occurrence: k}}, &d, nil)
		return st
	}
	next := func(rule recur.Rule, dueMs, redisNow, k int64) store.Settle {
		t.Helper()
		return nextJ(rule, jitter, dueMs, redisNow, k)
	}

	rule := recur.Rule{Every: every}
	due, offs := base0+off(1), map[int64]bool{}
	for k := int64(1); k <= 1000; k++ {
		offs[due-(base0+(k-1)*every.Milliseconds())] = true
		st := next(rule, due, due, k)
		base := base0 + k*every.Milliseconds()
		if st.Outcome != store.Next || st.NextDueMs < base || st.NextDueMs >= base+jitter.Milliseconds() || st.NextDueMs != base+off(k+1) {
			t.Fatalf("occurrence %d: %+v; want next due %d + its offset %d, in [%d, %d)", k+1, st, base, off(k+1),
				base, base+jitter.Milliseconds())
		}
		due = st.NextDueMs
	}
	if len(offs) < 900 {
		t.Fatalf("1000 occurrences drew %d distinct offsets: each should draw its own", len(offs))
	}

	// Occurrence 4 delivered 10.5 periods late: the next is the first base
	// after now, in the rule's phase, with occurrence 5's offset.
	late := base0 + 3*every.Milliseconds() + off(4)
	now := late + 10*every.Milliseconds() + every.Milliseconds()/2
	if st := next(rule, late, now, 4); st.NextDueMs != base0+14*every.Milliseconds()+off(5) {
		t.Errorf("catch-up: next due %d, want %d", st.NextDueMs, base0+14*every.Milliseconds()+off(5))
	}

	// A jitter longer than the period: an occurrence delivered on time,
	// after the next one's base, must not count as a late one that the
	// default catch-up skips the next over.
	long := 90 * time.Second
	due = base0 + envelope.JitterOffset(id, 1, long).Milliseconds()
	for k := int64(1); k <= 200; k++ {
		st := nextJ(rule, long, due, due, k)
		want := base0 + k*every.Milliseconds() + envelope.JitterOffset(id, k+1, long).Milliseconds()
		if st.NextDueMs != want {
			t.Fatalf("jitter %s over a %s period, occurrence %d delivered on time at %d: next due %d, want %d",
				long, every, k, due, st.NextDueMs, want)
		}
		due = st.NextDueMs
	}

	// Until bounds the base: an occurrence whose base is the until is
	// delivered, jitter or not; the one after is not.
	rule.Until = time.UnixMilli(base0 + every.Milliseconds())
	if st := next(rule, base0+off(1), base0, 1); st.Outcome != store.Next || st.NextDueMs != base0+every.Milliseconds()+off(2) {
		t.Errorf("until at the next base: %+v, want it due at %d", st, base0+every.Milliseconds()+off(2))
	}
	if st := next(rule, base0+every.Milliseconds()+off(2), base0, 2); st.Outcome != store.Delivered {
		t.Errorf("past until: %+v, want the series finished", st)
	}

	// A next occurrence the jitter would move to MaxDue or later ends the
	// series: due times must stay in range.
	rule = recur.Rule{Every: every}
	k := int64(1)
	for envelope.JitterOffset(id, k+1, jitter) == 0 {
		k++
	}
	last := envelope.MaxDue.UnixMilli() - every.Milliseconds() - off(k+1)
	if st := next(rule, last+off(k), last, k); st.Outcome != store.Delivered {
		t.Errorf("next jittered due at MaxDue: %+v, want the series finished", st)
	}
}
