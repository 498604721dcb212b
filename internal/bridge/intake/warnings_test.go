package intake

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// The warning that requests get 504 because the replicas did not confirm
// their writes is one line per shortLogEvery on the intake's clock, however
// many requests fail meanwhile.
func TestNotReplicatedWarningOncePerInterval(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	var out bytes.Buffer // notReplicated runs on this goroutine only
	in := NewIntake(nil, nil, nil, nil, nil, IntakeOptions{Options: Options{Batch: 1, Now: clock.Now}},
		hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info}))
	lines := func() int { return strings.Count(out.String(), "requests answered 504") }
	for range 10 {
		in.notReplicated(store.ErrNotReplicated)
	}
	if lines() != 1 {
		t.Fatalf("10 failures at once: %d lines, want 1:\n%s", lines(), out.String())
	}
	clock.Advance(shortLogEvery - time.Millisecond)
	in.notReplicated(store.ErrNotReplicated)
	if lines() != 1 {
		t.Fatalf("within the interval: %d lines, want 1", lines())
	}
	clock.Advance(time.Millisecond)
	in.notReplicated(store.ErrNotReplicated)
	if lines() != 2 {
		t.Fatalf("one interval after the line: %d lines, want 2", lines())
	}
}

// An intake that waits because what it holds fills its byte bound says so,
// once per pauseLogEvery on its clock however often it waits: a bound
// that never frees is a stall the log shows, not a silence.
func TestHeldBytesPauseLoggedOncePerInterval(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	var out testutil.Buffer
	h := newHeldBytes(100, "request intake", "intake.pending_bytes",
		hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info}), clock.Now)
	const line = "request intake paused"
	pause := func(want int) {
		t.Helper()
		h.acquire(80)
		done := make(chan struct{})
		go func() { h.acquire(50); close(done) }()
		for end := time.Now().Add(10 * time.Second); h.waiting() == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("the second acquire did not wait")
			}
		}
		h.release(80)
		<-done
		h.release(50)
		if n := strings.Count(out.String(), line); n != want {
			t.Fatalf("%d lines %q, want %d:\n%s", n, line, want, out.String())
		}
	}
	pause(1)
	pause(1)
	clock.Advance(pauseLogEvery)
	pause(2)
	if !strings.Contains(out.String(), "intake.pending_bytes") {
		t.Errorf("the line does not name the bound's key:\n%s", out.String())
	}
	if n := h.bytes(); n != 0 {
		t.Errorf("%d bytes held after every release, want 0", n)
	}
}
