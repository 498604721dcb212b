package scanner

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// During an outage the claim-failure warning is one line per failLogEvery
// on the scanner's clock, and "claims recovered" follows only a failure
// that was logged; after it, the next failure is logged at once.
func TestClaimFailureWarningOncePerInterval(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	const redisMs = int64(2_000_000_000_000)
	fail := true
	st := newClaimStore(1, func([]int) ([]store.ClaimResult, error) {
		if fail {
			return nil, errors.New("store: claim: connection refused")
		}
		return []store.ClaimResult{result(0, redisMs*1000, 0)}, nil
	})
	var out bytes.Buffer // scan runs on this goroutine: no lock needed
	opt := loopOpts
	opt.Now = clock.Now
	s := New(st, newSwitchPub(), nil, opt, hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info}))
	scan := func() {
		t.Helper()
		_ = s.scan(context.Background(), []int{0})
		<-st.claims
	}
	lines := func(msg string) int { return strings.Count(out.String(), msg) }
	const failed, recovered = "claim failed, retrying", "claims recovered on every shard"
	want := func(step string, f, r int) {
		t.Helper()
		if lines(failed) != f || lines(recovered) != r {
			t.Fatalf("%s: %d failure and %d recovery lines, want %d and %d:\n%s", step, lines(failed), lines(recovered), f, r, out.String())
		}
	}

	scan()
	scan()
	scan()
	want("three failures at once", 1, 0)
	clock.Advance(failLogEvery - time.Millisecond)
	scan()
	want("within the interval", 1, 0)
	clock.Advance(time.Millisecond)
	scan()
	want("one interval after the line", 2, 0)
	fail = false
	scan()
	scan()
	want("recovered", 2, 1)
	fail = true
	scan()
	want("a new outage", 3, 1)
}
