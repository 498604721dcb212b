package client_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// The servers the tests and examples share, each started on first use: a
// NATS server (most tests answer with fakes on it), and a delayd in this
// process, on a throwaway redis-server, serving the default prefix
// "delayd" on that NATS server.
var (
	natsServer = testutil.NewShared(func(t testing.TB) { sharedNATS = testutil.StartNATS(t) })
	delayd     = testutil.NewShared(func(t testing.TB) {
		natsServer.Need(t)
		c := daemontest.Config(sharedNATS, testutil.StartRedis(t))
		c.Limits.MaxPayload = 65536
		daemontest.Start(t, c)
		waitStream(t)
	})
	sharedNATS *testutil.NATS
)

func TestMain(m *testing.M) {
	os.Exit(testutil.RunMain(m, func(t testing.TB) {
		testutil.RedisBinary(t) // without redis-server, skip the package (fail under CI=true) as before
		t.Cleanup(natsServer.Stop)
		t.Cleanup(delayd.Stop) // cleanups run last first: the daemon stops before its NATS server
	}))
}

// daemonURL is the URL of the NATS server with the shared delayd, for the
// examples: they have no *testing.T, so a setup that fails ends the run.
func daemonURL() string {
	if err := delayd.Started(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the examples' daemon:", err)
		delayd.Stop()
		natsServer.Stop()
		os.Exit(1)
	}
	return sharedNATS.URL()
}

// waitStream waits until the daemon has set its intake stream up, so that
// Publish finds it.
func waitStream(t testing.TB) {
	t.Helper()
	nc, err := nats.Connect(sharedNATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		if _, err := js.Consumer(ctx, "DELAYD_INTAKE", "DELAYD_INTAKE"); err == nil {
			return
		} else if ctx.Err() != nil {
			t.Fatalf("the daemon's intake stream did not come up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// connect connects to the shared NATS server, without a daemon.
func connect(t testing.TB) *nats.Conn {
	t.Helper()
	natsServer.Need(t)
	nc, err := nats.Connect(sharedNATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

// connectDaemon connects to the shared NATS server with the shared delayd
// serving on it.
func connectDaemon(t testing.TB) *nats.Conn {
	t.Helper()
	delayd.Need(t)
	return connect(t)
}
