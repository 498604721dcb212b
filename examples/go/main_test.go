package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// TestExample runs the example against a real delayd (in this process).
func TestExample(t *testing.T) {
	r := testutil.StartRedis(t)
	n := testutil.StartNATS(t)
	daemontest.Start(t, daemontest.Config(n, r))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	getenv := func(k string) string {
		if k == "NATS_URL" {
			return n.URL()
		}
		return ""
	}
	if err := run(ctx, getenv, &out); err != nil {
		t.Fatal(err)
	}
	want := "scheduled stretch-1\ncancelled later-1 true\nreceived \"time to stretch\" (Delayd-Id stretch-1, attempt 1)\n"
	if out.String() != want {
		t.Errorf("output\n%s\nwant\n%s", out.String(), want)
	}
}
