package daemon

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// untilStopped is a component that runs until its context ends, then
// records its name and returns err.
func untilStopped(name string, rec *recorder, err error) component {
	return component{name, func(ctx context.Context) error {
		<-ctx.Done()
		rec.add(name)
		return err
	}}
}

type recorder struct {
	mu    sync.Mutex
	names []string
}

func (r *recorder) add(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names = append(r.names, name)
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.names)
}

func TestFirstFailureStopsTheRest(t *testing.T) {
	rec := &recorder{}
	boom := errors.New("boom")
	comps := []component{
		untilStopped("a", rec, nil),
		{"b", func(context.Context) error { time.Sleep(10 * time.Millisecond); return boom }},
		untilStopped("c", rec, nil),
	}
	err := runOrdered(context.Background(), comps, 5*time.Second, hclog.NewNullLogger())
	if !errors.Is(err, boom) || err.Error() != "b: boom" {
		t.Fatalf("got %v, want b: boom", err)
	}
	if got := rec.got(); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("stopped %v, want [a c]", got)
	}
}

// A component that returns nil before it was asked to is a failure too.
func TestReturningEarlyIsAFailure(t *testing.T) {
	comps := []component{{"quitter", func(context.Context) error { return nil }}, untilStopped("a", &recorder{}, nil)}
	if err := runOrdered(context.Background(), comps, 5*time.Second, hclog.NewNullLogger()); err == nil || err.Error() != "quitter: stopped" {
		t.Fatalf("got %v, want quitter: stopped", err)
	}
}

// Each component is stopped only once the one before it has returned.
func TestStopOrder(t *testing.T) {
	rec := &recorder{}
	var comps []component
	for _, name := range []string{"intake", "ownership", "scanner", "admin"} {
		comps = append(comps, component{name, func(ctx context.Context) error {
			<-ctx.Done()
			time.Sleep(5 * time.Millisecond) // a later one stopped too soon would record first
			rec.add(name)
			return nil
		}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := runOrdered(ctx, comps, 5*time.Second, hclog.NewNullLogger()); err != nil {
		t.Fatal(err)
	}
	if got := rec.got(); !slices.Equal(got, []string{"intake", "ownership", "scanner", "admin"}) {
		t.Fatalf("stopped in order %v", got)
	}
}

func TestShutdownDeadlineExceeded(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	rec := &recorder{}
	comps := []component{
		untilStopped("a", rec, nil),
		{"stuck", func(context.Context) error { <-release; return nil }},
		untilStopped("after", rec, nil),
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	err := runOrdered(ctx, comps, 50*time.Millisecond, hclog.NewNullLogger())
	if err == nil || !strings.Contains(err.Error(), "shutdown deadline 50ms exceeded while stopping stuck") {
		t.Fatalf("got %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("returned after %s, deadline 50ms", took)
	}
	if got := rec.got(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("stopped %v, want [a]", got)
	}
}

// Errors returned while stopping are joined, each with its component's
// name; the failure that began the shutdown is not repeated.
func TestJoinedErrors(t *testing.T) {
	errA, errB, boom := errors.New("a failed to stop"), errors.New("b failed to stop"), errors.New("boom")
	rec := &recorder{}
	comps := []component{
		untilStopped("a", rec, errA),
		{"failing", func(context.Context) error { time.Sleep(10 * time.Millisecond); return boom }},
		untilStopped("b", rec, errB),
	}
	err := runOrdered(context.Background(), comps, 5*time.Second, hclog.NewNullLogger())
	for _, want := range []error{errA, errB, boom} {
		if !errors.Is(err, want) {
			t.Errorf("%v does not include %v", err, want)
		}
	}
	if msg := err.Error(); msg != "failing: boom\na: a failed to stop\nb: b failed to stop" {
		t.Errorf("got %q", msg)
	}
}
