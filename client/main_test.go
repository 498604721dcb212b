package client_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/testutil"
)

// natsURL is the shared NATS server, with a delayd (the real binary, on a
// throwaway redis-server) serving the default prefix "delayd". The
// examples have no *testing.T, so the servers are started once, here.
var natsURL string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunMain(m, func(t testing.TB) {
		r := testutil.StartRedis(t)
		n := testutil.StartNATS(t)
		testutil.StartDaemon(t, testutil.BuildBinary(t), n, r, "DELAYD_LIMITS_MAX_PAYLOAD=65536")
		natsURL = n.URL()
		waitStream(t)
	}))
}

// waitStream waits until the daemon has set its intake stream up, so that
// Publish finds it.
func waitStream(t testing.TB) {
	t.Helper()
	nc := connect(t)
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

func connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	return nc
}
