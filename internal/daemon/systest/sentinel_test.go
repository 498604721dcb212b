package systest

import (
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// TestRedisSentinelFailover: delayd follows a Sentinel failover mid-run;
// the run completes, and loss is reported (bounded by what the master
// acknowledged and did not replicate before it died).
func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	sn := testutil.StartSentinel(t)
	e := &daemontest.Env{T: t, Redis: sn.Replica, NATS: testutil.StartNATS(t)}
	c := e.Config()
	c.Redis.Addrs = []string{sn.Addr}
	c.Redis.MasterName = "mymaster"
	f := daemontest.NewWorkloadOn(e, "sen.x", e.CaptureStream("SEN", "sen.>"))
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	start := time.Now().Add(1500 * time.Millisecond)
	old := sn.MasterAddr(t)
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		time.Sleep(time.Until(start.Add(time.Second)))
		sn.Master.Kill()
		t.Logf("killed master %s mid-run", old)
	}()
	f.Schedule(nc, 3000, start, 3*time.Second, time.Now().Add(40*time.Second))
	<-killed // before the cleanup's Kill reads the process
	dups, lost := f.VerifyLoss(t, 30*time.Second, true)
	if now := sn.MasterAddr(t); now == old {
		t.Errorf("no failover happened (master still %s)", now)
	}
	t.Logf("sentinel failover: %d of %d acknowledged envelopes lost, %d duplicates", lost, f.Acked(), dups)
}
