package daemon_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// A daemon built by New serves schedules, delivers them, and stops
// cleanly.
func TestRunServesAndStops(t *testing.T) {
	n, r := testutil.StartNATS(t), testutil.StartRedis(t)
	d := daemontest.Start(t, daemontest.Config(n, r))
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("orders.cancel")
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("delayd.schedule")
	m.Header.Set("Delayd-Target", "orders.cancel")
	m.Header.Set("Delayd-Delay", "100ms")
	m.Data = []byte("order 42")
	if rep, err := nc.RequestMsg(m, 5*time.Second); err != nil || rep.Header.Get("Nats-Service-Error") != "" {
		t.Fatalf("schedule: %v %v", err, rep)
	}
	got, err := sub.NextMsg(10 * time.Second)
	if err != nil || string(got.Data) != "order 42" {
		t.Fatalf("delivery: %v %v", err, got)
	}
	if err := d.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// A part that cannot start (here the admin server's port is taken) ends
// Run with its error, and what was built before it is closed.
func TestRunReturnsAStartError(t *testing.T) {
	n, r := testutil.StartNATS(t), testutil.StartRedis(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := daemontest.Config(n, r)
	c.HTTP.Addr = ln.Addr().String()
	before := n.Srv.NumClients()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = daemon.New(c, hclog.NewNullLogger()).Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "address already in use") || ctx.Err() != nil {
		t.Fatalf("got %v, want the admin server's listen error at once", err)
	}
	if !testutil.Eventually(5*time.Second, func() bool { return n.Srv.NumClients() <= before }) {
		t.Fatalf("%d NATS connections left open", n.Srv.NumClients()-before)
	}
}

// With NATS unreachable, stopping takes shutdown.timeout at most: before,
// the last flush of the delivery connection waited 2 s more after the
// deadline, for a server that was not there.
func TestShutdownKeepsItsDeadlineWithNATSDown(t *testing.T) {
	n, r := testutil.StartNATS(t), testutil.StartRedis(t)
	c := daemontest.Config(n, r)
	c.Shutdown.Timeout = 500 * time.Millisecond
	c.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	d := daemontest.Start(t, c)
	n.Stop()
	testutil.Wait(t, 5*time.Second, "the daemon's NATS connections notice", func() bool {
		_, body := daemontest.HTTPGet(t, "http://"+c.HTTP.Addr+"/metrics")
		v, ok := daemontest.Metric(body, "delayd_nats_connected")
		return ok && v == 0
	})
	start := time.Now()
	_ = d.Stop() // may report the deadline: the intake could not drain
	if took := time.Since(start); took > c.Shutdown.Timeout+700*time.Millisecond {
		t.Fatalf("stopping with NATS down took %s, shutdown.timeout is %s", took.Round(time.Millisecond), c.Shutdown.Timeout)
	}
}

// The daemon exports its mode on delayd_build_info: an intake-only daemon
// says so, and the alert that wants a shard reporter leaves it out.
func TestBuildInfoCarriesTheMode(t *testing.T) {
	n, r := testutil.StartNATS(t), testutil.StartRedis(t)
	c := daemontest.Config(n, r)
	c.Mode = "intake"
	c.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	daemontest.Start(t, c)
	resp, err := http.Get("http://" + c.HTTP.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "delayd_build_info{") {
			if !strings.Contains(line, `mode="intake"`) {
				t.Fatalf("%s: want mode=\"intake\"", line)
			}
			return
		}
	}
	t.Fatalf("no delayd_build_info in:\n%s", b)
}
