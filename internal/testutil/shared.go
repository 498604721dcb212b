package testutil

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

// ErrSkipped is why Shared.Started fails when the setup skipped (for
// example without redis-server outside CI).
var ErrSkipped = errors.New("skipped")

// Shared is servers the tests and examples of a package share, started on
// first use instead of before every test as with RunMain: a run of tests
// that need none starts none. TestMain calls Stop after the tests.
type Shared struct {
	setup func(t testing.TB)
	once  sync.Once
	tb    mainTB
}

// NewShared returns servers that setup starts, at most once. setup gets a
// testing.TB like RunMain's: its cleanups run at Stop.
func NewShared(setup func(t testing.TB)) *Shared { return &Shared{setup: setup} }

// Started runs the setup unless it ran, in a goroutine of its own, and
// returns why it failed or skipped (ErrSkipped), if it did. It is for
// examples, which have no *testing.T; tests call Need.
func (s *Shared) Started() error {
	s.once.Do(func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.setup(&s.tb)
		}()
		<-done
	})
	switch {
	case s.tb.failed:
		return fmt.Errorf("setting up the shared servers: %s", s.tb.msg)
	case s.tb.skipped:
		return fmt.Errorf("%w: %s", ErrSkipped, s.tb.msg)
	}
	return nil
}

// Need is Started for a test: t fails or skips as the setup did.
func (s *Shared) Need(t testing.TB) {
	t.Helper()
	err := s.Started()
	switch {
	case errors.Is(err, ErrSkipped):
		t.Skip(err)
	case err != nil:
		t.Fatal(err)
	}
}

// Stop runs the setup's cleanups, last first, if it ran.
func (s *Shared) Stop() { s.tb.cleanup() }
