package systest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/envelope"
)

// Delayd-Jitter 2s on envelopes due at one instant: none is delivered
// before its due time, each Delayd-Due is the jittered moment in
// [due, due + 2s), they spread over most of it, and a resend lands on the
// same moment. Correctness only: how late they are is the benchmarks'.
func TestJitterSpreadsDeliveries(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.Lease = longLease
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "jitter.check")
	const (
		n      = 500
		jitter = 2 * time.Second
	)
	due := time.Now().Add(2 * time.Second).Truncate(time.Millisecond)
	set := func(_ int, h nats.Header) {
		h.Set("Delayd-Target", "jitter.check")
		h.Set("Delayd-At", due.UTC().Format(time.RFC3339Nano))
		h.Set("Delayd-Jitter", jitter.String())
	}
	ids := daemontest.ScheduleMany(t, nc, n, 16, "j", set)

	h := daemontest.Hdr("Delayd-Id", ids[0])
	set(0, h)
	rep, err := daemontest.Schedule(nc, "delayd", h, "x")
	var sr client.Scheduled
	if err != nil || json.Unmarshal(rep.Data, &sr) != nil {
		t.Fatalf("resend: %v %q", err, rep.Data)
	}
	if want := due.Add(envelope.JitterOffset(ids[0], 1, jitter)); !sr.DeliverAt.Equal(want) {
		t.Errorf("resend due at %s, want %s", sr.DeliverAt.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano))
	}

	s.WaitCount(n, 10*time.Second)
	_, dups := s.Check(t, ids) // none before its Delayd-Due, none lost
	if dups != 0 {
		t.Errorf("%d duplicates without any fault", dups)
	}
	lo, hi := due.Add(jitter), due
	for id, ds := range s.All() {
		for _, d := range ds {
			if d.Due.Before(due) || !d.Due.Before(due.Add(jitter)) || d.Received.Before(due) {
				t.Errorf("%s: Delayd-Due %s, received %s; want both from %s, the due in [due, due+%s)",
					id, d.Due.Format(time.RFC3339Nano), d.Received.Format(time.RFC3339Nano), due.Format(time.RFC3339Nano), jitter)
			}
			if d.Header.Get("Delayd-Jitter") != "" || d.Header.Get("Delayd-Jitter-Ms") != "" {
				t.Errorf("%s: delivered with the jitter's header: %v", id, d.Header)
			}
			if d.Due.Before(lo) {
				lo = d.Due
			}
			if d.Due.After(hi) {
				hi = d.Due
			}
		}
	}
	if hi.Sub(lo) < 1500*time.Millisecond {
		t.Errorf("Delayd-Due spread over %s, want at least 1.5s", hi.Sub(lo))
	}
}

// A jittered series through the daemon: occurrence k is due at the rule's
// k-th time plus its own offset, so the store's next due times carry the
// offsets and the rule's times do not drift.
func TestJitteredSeries(t *testing.T) {
	e, nc, s := seriesDaemon(t, "jitter.series")
	const jitter = 800 * time.Millisecond
	start := time.Now().Add(time.Second).Truncate(time.Millisecond)
	daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "jitter.series", "Delayd-Every", "1s", "Delayd-Count", "4",
		"Delayd-Start", start.UTC().Format(time.RFC3339Nano), "Delayd-Jitter", jitter.String(), "Delayd-Id", "js"), "tick")

	s.WaitFor("js", 10*time.Second, daemontest.AtLeast(4))
	daemontest.Quiet(t, e, e.Config(), s)
	ds := s.Get("js")
	if len(ds) != 4 {
		t.Fatalf("%d deliveries, want 4: %s", len(ds), daemontest.Describe(ds))
	}
	for i, d := range ds {
		k := int64(i + 1)
		want := start.Add(time.Duration(i)*time.Second + envelope.JitterOffset("js", k, jitter))
		if d.Occurrence() != k || !d.Due.Equal(want) || d.Received.Before(d.Due) {
			t.Errorf("delivery %d: occurrence %d due %s, received %s; want occurrence %d due %s, not received before",
				i, d.Occurrence(), d.Due.Format(time.RFC3339Nano), d.Received.Format(time.RFC3339Nano), k, want.Format(time.RFC3339Nano))
		}
	}
}
