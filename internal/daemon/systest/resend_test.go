package systest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// TestResendOfADeliveredEnvelope: a client that resends its request with
// the same id after the envelope was delivered (it got a 504 or timed out
// the first time, as across a Redis failover) is answered with the
// deliver_at the envelope had, and nothing is delivered twice, for a
// Delayd-At and for a Delayd-Delay resent later alike. A request that
// differs is a new version, delivered again. Before intake.dedupe_window
// each resend was stored again and delivered as attempt 1.
func TestResendOfADeliveredEnvelope(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	defer e.StartDaemon(c)()
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "resend.t")

	at := time.Now().Add(50 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	// Further in the past than the window: due at once, and remembered
	// from when it was accepted.
	past := time.Now().Add(-2 * c.Intake.DedupeWindow).UTC().Format(time.RFC3339Nano)
	requests := map[string][]string{
		"at":    {"Delayd-Target", "resend.t", "Delayd-At", at, "Delayd-Id", "r-at", "X-Trace", "t1"},
		"delay": {"Delayd-Target", "resend.t", "Delayd-Delay", "50ms", "Delayd-Id", "r-delay"},
		"past":  {"Delayd-Target", "resend.t", "Delayd-At", past, "Delayd-Id", "r-past"},
	}
	deliverAt := map[string]string{}
	send := func(name, payload string) string {
		t.Helper()
		m, err := daemontest.Schedule(nc, c.Subject, daemontest.Hdr(requests[name]...), payload)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if e := m.Header.Get("Nats-Service-Error"); e != "" {
			t.Fatalf("%s: %s", name, e)
		}
		var r struct {
			DeliverAt string `json:"deliver_at"`
		}
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		return r.DeliverAt
	}
	for name := range requests {
		deliverAt[name] = send(name, "p")
	}
	s.WaitIDs([]string{"r-at", "r-delay", "r-past"}, 10*time.Second)
	daemontest.Quiet(t, e, c, s)
	if got := s.Get("r-at"); len(got) != 1 || got[0].Header.Get("Delayd-Request") != "" {
		t.Fatalf("r-at delivered %d times, headers %v; want once, without delayd's own", len(got), got)
	}

	for name := range requests {
		if again := send(name, "p"); again != deliverAt[name] {
			t.Errorf("%s resent after delivery: deliver_at %s, want the first one's %s", name, again, deliverAt[name])
		}
	}
	daemontest.Quiet(t, e, c, s)
	for _, id := range []string{"r-at", "r-delay", "r-past"} {
		if n := len(s.Get(id)); n != 1 {
			t.Errorf("%s delivered %d times after a resend of the same request, want 1", id, n)
		}
	}

	// Another payload under the id is a new version.
	send("delay", "q")
	s.WaitIDs([]string{"r-delay"}, 10*time.Second)
	daemontest.Quiet(t, e, c, s)
	if got := s.Get("r-delay"); len(got) != 2 || got[1].Data != "q" {
		t.Fatalf("r-delay with another payload: %d deliveries, want a second one with q", len(got))
	}
}

// TestResendAfter504 is the failover case: with redis.wait_replicas 1 and
// the replica stopped, a schedule is answered 504 (on the master, not
// confirmed) and still delivered from the master. The client resends the
// same request, as the docs advise, once the replica is back: it is
// answered 200 with the deliver_at it had, and delivered once in all.
// Before the tombstones it was scheduled again and delivered twice, both
// as attempt 1.
func TestResendAfter504(t *testing.T) {
	t.Parallel()
	m := testutil.StartRedis(t)
	r := testutil.StartReplica(t, m)
	e := &daemontest.Env{T: t, Redis: m, NATS: testutil.StartNATS(t)}
	c := e.Config()
	c.Redis.WaitReplicas, c.Redis.WaitTimeout = 1, 300*time.Millisecond
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "resend.f")

	at := time.Now().Add(500 * time.Millisecond)
	r.Pause()
	if code, id := waitSchedule(t, nc, "f1", "resend.f", at); code != "504" || id != "f1" {
		r.Resume()
		t.Fatalf("schedule with the replica stopped: code %q id %q, want 504 with the id", code, id)
	}
	got.WaitIDs([]string{"f1"}, 10*time.Second)
	r.Resume()
	testutil.WaitReplicas(t, m, 1, 10*time.Second)
	daemontest.Quiet(t, e, c, got)
	if code, _ := waitSchedule(t, nc, "f1", "resend.f", at); code != "" {
		t.Fatalf("the resend: %q, want 200", code)
	}
	daemontest.Quiet(t, e, c, got)
	if d := got.Get("f1"); len(d) != 1 {
		t.Fatalf("f1 delivered %d times after a 504 and a resend of the same request, want once", len(d))
	}
}
