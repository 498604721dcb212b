package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/delayd/delayd/internal/bench"
)

// TestBenchCommand runs `delayd bench` against a running daemon and checks
// its JSON result adds up.
func TestBenchCommand(t *testing.T) {
	e := newEnv(t)
	c := e.cfg()
	e.startDaemon(c)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"delayd", "bench", "--nats-url", e.nats.URL(), "--json",
		"--count", "500", "--concurrency", "8", "--window", "500ms", "--lead", "1s", "--grace", "5s", "--conns", "2"},
		func(string) string { return "" }, &out, &errOut)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, errOut.String())
	}
	var r bench.Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, out.String())
	}
	if r.Delivered != 500 || r.Lost != 0 || r.Early != 0 || r.Duplicates != 0 || r.Rejected != 0 {
		t.Fatalf("bench result: %+v", r)
	}
	if r.BaselineRate <= 0 || r.IntakeRate <= 0 || r.IntakeRatio <= 0 || len(r.Histogram) == 0 {
		t.Fatalf("bench figures missing: %+v", r)
	}
	t.Logf("bench: intake %.0f/s (%.0f%% of %.0f/s), p99 %.2f ms", r.IntakeRate, 100*r.IntakeRatio, r.BaselineRate, r.LatenessMs.P99)
}
