package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The server formats a refused subject with %q: it must be read back
// exactly, whatever it holds.
func TestRefusedSubjectUnquotes(t *testing.T) {
	t.Parallel()
	for _, subj := range []string{"a.b", `a"b`, `a\b`, "caf\xe9", "x.y.z"} {
		msg := fmt.Sprintf("%v: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, subj)
		got, ok := refusedSubject(msg)
		if !ok || got != subj {
			t.Errorf("%q: read %q %v", subj, got, ok)
		}
	}
	if _, ok := refusedSubject("nats: permissions violation: Permissions Violation for Subscription to \"x\""); ok {
		t.Error("a refused subscription is not a refused publish")
	}
}

// A batch whose refusals overflowed the record, or that holds a refusal
// it cannot read, is reported incomplete, so nothing refused counts as
// delivered.
func TestRefusalsCompleteness(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r := NewRefusals()
	mark := r.Mark()
	var last error
	for i := range refusalsKept + 10 {
		last = fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, fmt.Sprintf("s.%d", i))
		r.record(last)
	}
	if _, complete := r.Since(ctx, mark, last); complete {
		t.Error("an overflowed record claims to be complete")
	}
	mark = r.Mark()
	last = fmt.Errorf("%w: Permissions Violation for Publish to garbled", nats.ErrPermissionViolation)
	r.record(last)
	if _, complete := r.Since(ctx, mark, last); complete {
		t.Error("an unreadable refusal claims to be complete")
	}
	mark = r.Mark()
	ok := fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, "a.b")
	r.record(ok)
	r.record(nats.ErrSlowConsumer) // a later error of another kind
	got, complete := r.Since(ctx, mark, nats.ErrSlowConsumer)
	if !complete || got["a.b"] == nil {
		t.Errorf("a refusal followed by another error: %v %v", got, complete)
	}
}

// With no error to wait for (the connection's last error did not change
// value, as a repeated slow-consumer error does not), since returns what
// was recorded at once.
func TestRefusalsSinceWithoutWaiting(t *testing.T) {
	t.Parallel()
	r := NewRefusals()
	mark := r.Mark()
	r.record(fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, "a.b"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // it must not need the context at all
	got, complete := r.Since(ctx, mark, nil)
	if !complete || got["a.b"] == nil {
		t.Fatalf("since without a last error: %v %v", got, complete)
	}
}
