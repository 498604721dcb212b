package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// proc is a delayd daemon running as a real child process.
type proc struct {
	cmd *exec.Cmd
	log string
}

func startProc(e *daemontest.Env, bin string, c config.Config) *proc {
	e.T.Helper()
	return startProcEnv(e, bin, c)
}

// startProcEnv starts a daemon process with extra environment settings.
func startProcEnv(e *daemontest.Env, bin string, c config.Config, extra ...string) *proc {
	e.T.Helper()
	cmd := exec.Command(bin, "run")
	cmd.Env = append(append(os.Environ(), extra...),
		"DELAYD_NATS_URL="+c.NATS.URL,
		"DELAYD_REDIS_ADDRS="+c.Redis.Addrs[0],
		"DELAYD_SHARDS="+strconv.Itoa(c.Shards),
		"DELAYD_SCANNER_LEASE="+c.Scanner.Lease.String(),
		"DELAYD_SCANNER_IDLE_INTERVAL="+c.Scanner.IdleInterval.String(),
		"DELAYD_HTTP_ADDR=127.0.0.1:0",
		"DELAYD_UI_ADDR=127.0.0.1:0",
		"DELAYD_OWNERSHIP_TTL="+c.Ownership.TTL.String(),
	)
	logPath := filepath.Join(e.T.TempDir(), "delayd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		e.T.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		e.T.Fatal(err)
	}
	p := &proc{cmd: cmd, log: logPath}
	e.T.Cleanup(func() {
		p.kill()
		logf.Close()
		if e.T.Failed() {
			b, _ := os.ReadFile(logPath)
			e.T.Logf("daemon log %s:\n%s", logPath, b)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, _ := os.ReadFile(logPath); strings.Contains(string(b), "delayd: ready") {
			return p
		}
		if time.Now().After(deadline) {
			e.T.Fatal("daemon process did not log ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

// TestKill9BetweenClaimAndAck kills the daemon with SIGKILL the moment the
// first of a burst of deliveries reaches the target, while the rest of the
// burst is claimed but not yet acknowledged. Those must still be in flight
// in Redis and be delivered again by a new daemon once their lease expires.
func TestKill9BetweenClaimAndAck(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.Lease = time.Second
	bin := delaydBinary(t)
	nc := e.Conn()
	defer nc.Close()
	st := store.New(store.NewClient(store.Options{Addrs: c.Redis.Addrs}), c.Namespace, c.Shards)
	defer st.Close()

	// The daemon reaches NATS through a proxy that holds the server's
	// replies back 300 ms: the flush that confirms the deliveries, and so
	// the ack, comes well after the first delivery reached the target, so
	// the kill lands between them however fast the machine is.
	proxy := testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", e.NATS.Opts.Port))
	slow := c
	slow.NATS.URL = "nats://" + proxy.Addr()
	p := startProc(e, bin, slow)
	proxy.Set(testutil.Down, testutil.Fault{Latency: 300 * time.Millisecond})
	first := e.Sink(nc, "crash.target")
	killed, _ := killOnFirst(t, nc, "crash.target", p)
	const n = 500
	at := time.Now().Add(500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "crash-" + strconv.Itoa(i)
		m := &nats.Msg{Subject: "delayd.schedule", Header: daemontest.Hdr("Delayd-Target", "crash.target", "Delayd-At", at, "Delayd-Id", ids[i]), Data: []byte(ids[i])}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	// One request/reply after the burst: once it is answered, the queue
	// group's single member has stored everything sent before it.
	if _, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "crash.target", "Delayd-At", at, "Delayd-Id", "crash-last"), "crash-last"); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, "crash-last")
	_ = p.cmd.Wait()
	if !killed.Load() {
		t.Fatal("daemon exited without being killed")
	}
	var inflight []string
	for _, id := range ids {
		if en, err := st.Get(context.Background(), id); err == nil && en.State == store.StateInflight {
			inflight = append(inflight, id)
		}
	}
	if len(inflight) == 0 {
		t.Fatal("kill -9 did not land between claim and ack: nothing in flight")
	}
	t.Logf("killed with %d envelopes claimed but not acknowledged", len(inflight))

	// The redeliveries are watched by a subscription made after the kill:
	// with nats-server 2.14 and 2.15 alike, subscribers that were receiving
	// from the publisher at the moment it was killed got later messages
	// from other publishers up to ~10 s late, a broker-side effect that
	// would make this test measure NATS rather than delayd.
	sc := e.Conn()
	defer sc.Close()
	second := e.Sink(sc, "crash.target")
	startProc(e, bin, c)
	second.WaitCount(len(inflight), 10*time.Second)
	daemontest.Quiet(t, e, c, first, second)
	for _, id := range ids {
		a, b := first.Get(id), second.Get(id)
		if len(a)+len(b) == 0 {
			t.Errorf("%s lost", id)
		}
		for _, d := range append(a, b...) {
			if d.Received.Before(d.Due) {
				t.Errorf("%s early", id)
			}
		}
	}
	for _, id := range inflight {
		ds := second.Get(id)
		if len(ds) != 1 || ds[0].Attempt != 2 || ds[0].Data != id {
			t.Errorf("%s claimed at the kill: redelivered %+v", id, ds)
			continue
		}
		if a := first.Get(id); len(a) == 1 && !a[0].Due.Equal(ds[0].Due) {
			t.Errorf("%s: Delayd-Due changed on redelivery", id)
		}
	}
	if n := e.Stored(c); n != 0 {
		t.Fatalf("%d envelopes left after redelivery", n)
	}
}

// killOnFirst subscribes to subject and kills p with SIGKILL when the first
// message arrives: the daemon dies with the rest of its batch claimed and
// not acknowledged. It counts every message seen.
func killOnFirst(t *testing.T, nc *nats.Conn, subject string, p *proc) (killed *atomic.Bool, seen *atomic.Int64) {
	t.Helper()
	killed, seen = new(atomic.Bool), new(atomic.Int64)
	if _, err := nc.Subscribe(subject, func(*nats.Msg) {
		seen.Add(1)
		if killed.CompareAndSwap(false, true) {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return killed, seen
}
