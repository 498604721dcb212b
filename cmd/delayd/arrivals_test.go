package main

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
	mu  sync.Mutex
	got map[string]*arrival
}

// recordArrivals subscribes to subject on nc and records what arrives.
func recordArrivals(t *testing.T, nc *nats.Conn, subject string) *arrivals {
	t.Helper()
	a := &arrivals{got: map[string]*arrival{}}
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
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		a.mu.Lock()
		n := 0
		for _, id := range ids {
			if a.got[id] != nil {
				n++
			}
		}
		a.mu.Unlock()
		if n == len(ids) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d delivered after %s", n, len(ids), within)
		}
	}
}

// once waits until each of ids arrived, then checks each arrived once,
// never early, and (when attempt is not "") as that attempt.
func (a *arrivals) once(t *testing.T, ids []string, attempt string) {
	t.Helper()
	a.wait(t, ids, 30*time.Second)
	time.Sleep(200 * time.Millisecond) // a duplicate would follow closely
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		if d := a.got[id]; d.n != 1 || d.early || attempt != "" && d.attempt != attempt {
			t.Errorf("%s: delivered %d times, early %v, attempt %s; want once, on time, attempt %q", id, d.n, d.early, d.attempt, attempt)
		}
	}
}
