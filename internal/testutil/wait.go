package testutil

import (
	"testing"
	"time"
)

// The one poll of the tests. A test waits for something to happen through
// Eventually or Wait (or a wait built on them: Sink.WaitIDs, Env.WaitReady,
// ...), never with a loop and a sleep of its own: CONTRIBUTING.md lists the
// few fixed sleeps that are the point of their test.

// pollMax bounds the interval between two checks. The first check comes at
// once, then the interval doubles from a millisecond: a quick event is seen
// within a few milliseconds, a slow one costs a check every pollMax.
const pollMax = 50 * time.Millisecond

// Eventually checks cond until it holds, for at most d (one check at least,
// the last one at the deadline), and reports whether it held. cond runs on
// the caller's goroutine, so it may fail the test itself.
func Eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for wait := time.Millisecond; ; wait = min(2*wait, pollMax) {
		if cond() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(wait, left))
	}
}

// Wait fails the test unless cond holds within d; what says what it waited
// for. A test whose failure should show the last state it saw uses
// Eventually and its own message.
func Wait(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(d, cond) {
		t.Fatalf("not within %s: %s", d, what)
	}
}
