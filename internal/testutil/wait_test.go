package testutil

import (
	"testing"
	"time"
)

// Eventually returns as soon as the condition holds, checking more than
// once; and reports false at the deadline, having checked up to it.
func TestEventually(t *testing.T) {
	t.Parallel()
	calls := 0
	start := time.Now()
	if !Eventually(5*time.Second, func() bool { calls++; return calls == 4 }) {
		t.Fatal("Eventually: false for a condition that came to hold")
	}
	if took := time.Since(start); calls != 4 || took > time.Second {
		t.Errorf("held at the 4th check: %d checks in %s", calls, took)
	}

	calls, start = 0, time.Now()
	if Eventually(200*time.Millisecond, func() bool { calls++; return false }) {
		t.Fatal("Eventually: true for a condition that never held")
	}
	if took := time.Since(start); took < 200*time.Millisecond || took > time.Second || calls < 4 {
		t.Errorf("gave up after %s and %d checks, want at the 200ms deadline, checking until then", took, calls)
	}
}
