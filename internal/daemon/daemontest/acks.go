package daemontest

import (
	"sync"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/testutil"
)

// Acks records, by id, the settles a daemon's scanner wrote to the store
// (daemon.WithAcked): a test waits on it for an ack nothing outside the
// daemon shows (one that must end a series, or resurrect nothing), where
// it would otherwise sleep.
type Acks struct {
	mu  sync.Mutex
	ids map[string]int
}

// NewAcks is an empty record; pass its Option to the daemons it watches.
func NewAcks() *Acks { return &Acks{ids: map[string]int{}} }

// Option makes a daemon report its acks to a.
func (a *Acks) Option() daemon.Option {
	return daemon.WithAcked(func(ids []string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, id := range ids {
			a.ids[id]++
		}
	})
}

// Count is how many settles of id were written.
func (a *Acks) Count(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ids[id]
}

// Wait fails the test unless n settles of id are written within d.
func (a *Acks) Wait(t testing.TB, id string, n int, d time.Duration) {
	t.Helper()
	if !testutil.Eventually(d, func() bool { return a.Count(id) >= n }) {
		t.Fatalf("%d acks of %s written within %s, want %d", a.Count(id), id, d, n)
	}
}
