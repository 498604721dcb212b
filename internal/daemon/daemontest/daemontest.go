// Package daemontest runs a delayd daemon inside a test's own process, for
// tests that need no separate one: no build, and no kill -9, exit status
// or footprint to observe (those use testutil.StartDaemon and the binary).
// It lives apart from testutil because the store's, scanner's and bridge's
// own tests import testutil, and a daemon imports those packages.
//
// Env is the harness of the daemon-level suite (internal/daemon/systest)
// and of cmd/delayd's tests of the binary: a test's servers, a Sink that
// records deliveries, waits on events (WaitIDs, WaitCount, WaitFor,
// WaitReady, Quiet) instead of fixed sleeps, and the Soak and SkipShort
// gates.
package daemontest

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
)

// Daemon is a daemon running in the test's process.
type Daemon struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// Config is a config for these servers with the settings of
// testutil.StartDaemon: 4 shards, a 100 ms idle interval, a 1 s ownership
// TTL, and the admin server and console on free loopback ports.
func Config(n *testutil.NATS, r *testutil.Redis) config.Config {
	c := config.Default()
	c.NATS.URL = n.URL()
	c.Redis.Addrs = []string{r.Addr}
	c.Shards = 4
	c.Scanner.IdleInterval = 100 * time.Millisecond
	c.Ownership.TTL = time.Second
	c.HTTP.Addr = "127.0.0.1:0"
	c.UI.Addr = "127.0.0.1:0"
	return c
}

// Start is Run, then WaitServing at c.NATS.URL.
func Start(t testing.TB, c config.Config, opts ...daemon.Option) *Daemon {
	t.Helper()
	d := Run(t, c, opts...)
	d.WaitServing(t, c.NATS.URL, c.Subject)
	return d
}

// Run validates c and runs daemon.New(c, log, opts...) in the background.
// It logs nowhere, or at debug level to stderr with DELAYD_TEST_LOG set.
// The test's cleanup stops it.
func Run(t testing.TB, c config.Config, opts ...daemon.Option) *Daemon {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	log := hclog.NewNullLogger()
	if os.Getenv("DELAYD_TEST_LOG") != "" {
		log = hclog.New(&hclog.LoggerOptions{Name: "delayd", Level: hclog.Debug, Output: os.Stderr})
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Daemon{cancel: cancel, done: make(chan error, 1)}
	go func() { d.done <- daemon.New(c, log, opts...).Run(ctx) }()
	t.Cleanup(func() { _ = d.Stop() })
	return d
}

// WaitServing is WaitService that fails the test at once if the daemon
// stops first.
func (d *Daemon) WaitServing(t testing.TB, url, subject string) {
	t.Helper()
	waitService(t, url, subject, d)
}

// Stop stops the daemon gracefully and returns what its Run returned. It
// may be called more than once.
func (d *Daemon) Stop() error {
	d.once.Do(func() {
		d.cancel()
		d.err = <-d.done
	})
	return d.err
}

// WaitService waits until a delayd answers cancel requests on subject at
// the NATS server at url, failing the test after 10 s.
func WaitService(t testing.TB, url, subject string) {
	t.Helper()
	waitService(t, url, subject, nil)
}

// waitService is WaitService that also fails the test at once if d (when
// not nil) stops.
func waitService(t testing.TB, url, subject string, d *Daemon) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	testutil.Wait(t, 10*time.Second, "the delayd service on "+subject+" answers", func() bool {
		m := nats.NewMsg(subject + ".cancel")
		m.Header.Set(envelope.HeaderID, "probe")
		if _, err := nc.RequestMsg(m, 200*time.Millisecond); err == nil {
			return true
		}
		if d != nil {
			select {
			case err := <-d.done:
				d.once.Do(func() { d.cancel(); d.err = err })
				t.Fatalf("delayd stopped before it served: %v", err)
			default:
			}
		}
		return false
	})
}
