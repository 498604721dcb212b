package daemontest

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/testutil"
)

// Workload is the fault suite's load: envelopes due over a window, each
// scheduled until delayd acknowledged it, delivered into a JetStream stream
// rather than to a core subscriber. The stream keeps every delivery across
// the faults, and its server-side receive time proves "never early"
// without trusting a test client that was itself disconnected.
type Workload struct {
	e      *Env
	target string
	stream jetstream.Stream
	mu     sync.Mutex
	acked  map[string]time.Time // id → requested due time
	// resent holds ids whose request was sent again after a failure: if the
	// first one was stored after all and delivered before the second
	// arrived, the second is a new schedule (an upsert) and delivers again.
	resent map[string]bool
}

// NewWorkload creates the stream F<name> for the target fault.<name>
// (give the daemon JetStreamConfig).
func NewWorkload(e *Env, name string) *Workload {
	return &Workload{e: e, target: "fault." + name, stream: e.Stream("F"+name, "fault."+name), acked: map[string]time.Time{}}
}

// JetStreamConfig is e.Config() delivering the workloads' streams with
// JetStream, with a 1 s lease.
func JetStreamConfig(e *Env) config.Config {
	c := e.Config()
	c.Targets.JetStream = []string{"fault.>"}
	c.Scanner.Lease = time.Second
	return c
}

// Schedule sends n envelopes due evenly over window from start, from 8
// workers, retrying each until it is acknowledged or the deadline passes.
// Requests that fail while a fault is on are retried with the same id, so
// a retry after a lost reply is an upsert, not a duplicate.
func (f *Workload) Schedule(nc *nats.Conn, n int, start time.Time, window time.Duration, deadline time.Time) {
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				id := f.target + "-" + strconv.Itoa(i)
				at := start.Add(time.Duration(int64(window) * int64(i) / int64(n)))
				try := 0
				testutil.Eventually(time.Until(deadline), func() bool {
					if try++; try == 2 {
						f.mu.Lock()
						if f.resent == nil {
							f.resent = map[string]bool{}
						}
						f.resent[id] = true
						f.mu.Unlock()
					}
					m := &nats.Msg{Subject: "delayd.schedule", Data: []byte(id),
						Header: Hdr("Delayd-Target", f.target, "Delayd-Id", id, "Delayd-At", at.UTC().Format(time.RFC3339Nano))}
					rep, err := nc.RequestMsg(m, 2*time.Second)
					if err != nil || rep.Header.Get(micro.ErrorHeader) != "" {
						return false
					}
					f.mu.Lock()
					f.acked[id] = at
					f.mu.Unlock()
					return true
				})
			}
		}()
	}
	wg.Wait()
}

// Verify waits until every acknowledged envelope is in the stream and the
// daemons have nothing left to settle, then checks: none lost, none early, and no duplicate without a higher
// attempt; it returns the duplicates. Delivery is at-least-once, so a
// busy machine that stalls a daemon past its lease may redeliver (with a
// higher Delayd-Attempt); what the promise rules out is an attempt number
// delivered twice. A copy of an earlier attempt arriving after a later one
// (a daemon frozen after its publish deadline check) still has its own
// number, and a resent request is a new version whose attempts start over.
func (f *Workload) Verify(t *testing.T, wait time.Duration) (dups int) {
	t.Helper()
	dups, _ = f.VerifyLoss(t, wait, false)
	return dups
}

// VerifyLoss is Verify that, with allowLoss, reports lost envelopes
// instead of failing on them, and allows an attempt delivered twice (for
// faults that can lose writes by design, like a Redis failover with
// asynchronous replication: a lost claim repeats its attempt number).
func (f *Workload) VerifyLoss(t *testing.T, wait time.Duration, allowLoss bool) (dups, lost int) {
	t.Helper()
	testutil.Eventually(wait, func() bool {
		info, err := f.stream.Info(context.Background())
		return err == nil && info.State.Msgs >= uint64(len(f.acked))
	})
	f.idle(10 * time.Second)
	info, err := f.stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string][]string{} // id → the attempts delivered, in the stream's order
	var lateness []time.Duration
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := f.stream.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatalf("get msg %d: %v", seq, err)
		}
		id := m.Header.Get("Delayd-Id")
		due, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Delayd-Due"))
		if m.Time.Before(due) {
			t.Errorf("%s stored in the stream %s before its due time", id, due.Sub(m.Time))
		}
		if want, ok := f.acked[id]; ok && due.Before(want.Truncate(time.Millisecond)) {
			t.Errorf("%s: Delayd-Due %s before the requested %s", id, due, want)
		}
		attempt := m.Header.Get("Delayd-Attempt")
		if len(seen[id]) > 0 {
			dups++
			if slices.Contains(seen[id], attempt) && !f.resent[id] && !allowLoss {
				t.Errorf("%s: delivered again as attempt %s after attempts %v: a duplicate without a higher attempt", id, attempt, seen[id])
			}
		} else {
			lateness = append(lateness, m.Time.Sub(due))
		}
		seen[id] = append(seen[id], attempt)
	}
	for id := range f.acked {
		if len(seen[id]) == 0 {
			lost++
		}
	}
	if lost > 0 && !allowLoss {
		t.Errorf("%d of %d acknowledged envelopes lost", lost, len(f.acked))
	}
	slices.Sort(lateness)
	if len(lateness) > 0 {
		t.Logf("%d acknowledged, %d delivered, %d duplicates, lateness p50 %s max %s",
			len(f.acked), len(seen), dups, lateness[len(lateness)/2], lateness[len(lateness)-1])
	}
	return dups, lost
}

// idle waits up to d until the daemons hold nothing pending or in flight
// (admin stats): a late duplicate comes from a claim not yet settled, and
// a publish is confirmed before its ack, so once nothing is left to settle
// the stream holds every copy there will be. It asserts nothing: Verify's
// checks say what went wrong.
func (f *Workload) idle(d time.Duration) {
	nc := f.e.Conn()
	defer nc.Close()
	cl := client.New(nc)
	testutil.Eventually(d, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := cl.Stats(ctx)
		return err == nil && st.Pending+st.Inflight == 0
	})
}

// Acked is how many envelopes delayd acknowledged.
func (f *Workload) Acked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.acked)
}

// NewWorkloadOn is a Workload for target delivered into stream, which the
// caller made (CaptureStream, for a target not delivered with JetStream).
func NewWorkloadOn(e *Env, target string, stream jetstream.Stream) *Workload {
	return &Workload{e: e, target: target, stream: stream, acked: map[string]time.Time{}}
}

// Target is the subject the workload's envelopes are delivered to.
func (f *Workload) Target() string { return f.target }

// Expect adds ids scheduled outside Schedule (with any due time) to what
// Verify expects.
func (f *Workload) Expect(ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		f.acked[id] = time.Time{}
	}
}
