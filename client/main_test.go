package client_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// urlVar names the NATS server the tests and examples run against. The
// client is a module of its own, importable from Go 1.21 with nats.go alone,
// so its tests cannot start servers (nats-server and a daemon would be
// dependencies of the module): the main module's internal/clienttest starts
// a NATS server with a delayd on it and runs these tests at Go 1.21 with
// this variable set. The delayd serves the default prefix "delayd" with
// 4 shards, limits.max_payload 65536 and its intake stream. Most tests
// answer with fakes of their own on the server, under other prefixes.
const urlVar = "DELAYD_CLIENT_TEST_NATS_URL"

var natsURL = os.Getenv(urlVar)

func TestMain(m *testing.M) {
	if natsURL == "" {
		// This module cannot start servers of its own (no dependency beyond
		// nats.go): internal/clienttest in the main module starts a delayd
		// and runs these tests with the variable set. `go test ./...` at
		// the repository's root does not list this package.
		if os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "FAIL: CI=true and %s is not set: run the client tests through internal/clienttest\n", urlVar)
			os.Exit(1)
		}
		fmt.Printf("client tests skipped: %s is not set (internal/clienttest in the main module runs them)\n", urlVar)
		os.Exit(0)
	}
	if err := waitStream(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: the delayd at %s=%s: %v\n", urlVar, natsURL, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// daemonURL is the URL of the NATS server with the delayd, for the
// examples.
func daemonURL() string { return natsURL }

// waitStream waits until the daemon has set its intake stream up, so that
// Publish finds it.
func waitStream() error {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		if _, err := js.Consumer(ctx, "DELAYD_INTAKE", "DELAYD_INTAKE"); err == nil {
			return nil
		} else if ctx.Err() != nil {
			return fmt.Errorf("its intake stream did not come up: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// connect connects to the NATS server with the delayd. Tests of the
// client alone use prefixes the delayd does not serve.
func connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	return nc
}
