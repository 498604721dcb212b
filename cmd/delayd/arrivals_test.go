package main

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/testutil"
)

// arrival is what reached a subscriber for one Delayd-Id.
type arrival struct {
	n       int    // deliveries
	attempt string // Delayd-Attempt of the last
	early   bool   // any before its Delayd-Due
}

// arrivals records the deliveries on a subject by Delayd-Id, for the
// tests that run several builds side by side (a rolling upgrade).
type arrivals struct {
	nc  *nats.Conn
	mu  sync.Mutex
	got map[string]*arrival
}

// recordArrivals subscribes to subject on nc and records what arrives.
func recordArrivals(t *testing.T, nc *nats.Conn, subject string) *arrivals {
	t.Helper()
	a := &arrivals{nc: nc, got: map[string]*arrival{}}
	if _, err := nc.Subscribe(subject, func(m *nats.Msg) {
		now := time.Now()
		a.mu.Lock()
		defer a.mu.Unlock()
		id := m.Header.Get("Delayd-Id")
		d := a.got[id]
		if d == nil {
			d = &arrival{}
			a.got[id] = d
		}
		d.n++
		d.attempt = m.Header.Get("Delayd-Attempt")
		if due, err := time.Parse(time.RFC3339Nano, m.Header.Get("Delayd-Due")); err != nil || now.Before(due) {
			d.early = true
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return a
}

// wait waits until each of ids arrived, failing the test after within.
func (a *arrivals) wait(t *testing.T, ids []string, within time.Duration) {
	t.Helper()
	n := 0
	if !testutil.Eventually(within, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		n = 0
		for _, id := range ids {
			if a.got[id] != nil {
				n++
			}
		}
		return n == len(ids)
	}) {
		t.Fatalf("%d of %d delivered after %s", n, len(ids), within)
	}
}

// once waits until each of ids arrived, then checks each arrived once,
// never early, and (when attempt is not "") as that attempt.
func (a *arrivals) once(t *testing.T, ids []string, attempt string) {
	t.Helper()
	a.wait(t, ids, 30*time.Second)
	// A duplicate would come from a claim not yet settled: once no id is
	// kept by delayd any more, a flush brings all that was sent before.
	cl := client.New(a.nc)
	testutil.Wait(t, 10*time.Second, "every id delivered gone from delayd", func() bool {
		return !slices.ContainsFunc(ids, func(id string) bool {
			_, err := cl.Get(context.Background(), id)
			return !errors.Is(err, client.ErrNotFound)
		})
	})
	if err := a.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		if d := a.got[id]; d.n != 1 || d.early || attempt != "" && d.attempt != attempt {
			t.Errorf("%s: delivered %d times, early %v, attempt %s; want once, on time, attempt %q", id, d.n, d.early, d.attempt, attempt)
		}
	}
}

// none fails the test if any of ids arrived.
func (a *arrivals) none(t *testing.T, ids []string) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		if d := a.got[id]; d != nil {
			t.Errorf("%s: delivered before its lease ended", id)
		}
	}
}
