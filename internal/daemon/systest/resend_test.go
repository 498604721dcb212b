package systest

import (
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

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
