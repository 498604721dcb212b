package bridge

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
	in := NewIntake(nil, nil, nil, nil, nil, IntakeOptions{Batch: 1, Now: clock.Now},
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
