package bridge

import (
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Liveness sets how often a connection pings the server and how many pings
// may go unanswered before nats.go counts it stale and reconnects, and
// records the connection's disconnects with their reason: a Publisher
// tells a batch cut by a stale connection (a silent path) from one cut by
// the server.
type Liveness struct {
	PingInterval time.Duration
	MaxPingsOut  int

	mu      sync.Mutex
	n       uint64 // disconnects seen
	stale   uint64 // the value of n at the last stale disconnect
	last    error  // the reason of the last disconnect
	changed chan struct{}
}

// LivenessFor derives the ping settings from ownership.ttl: a ping every
// ttl/4 and stale after 3 unanswered, so a silent path is noticed 3/4 ttl
// to ttl after it fell silent (before the ownership round that would find
// it), and a round trip shorter than ttl/2 never looks stale.
func LivenessFor(ttl time.Duration) *Liveness {
	return &Liveness{PingInterval: ttl / 4, MaxPingsOut: 3}
}

// options are the nats.go options of l; none (nats.go's defaults: 2 min,
// 2 out) for a nil l.
func (l *Liveness) options() []nats.Option {
	if l == nil || l.PingInterval <= 0 {
		return nil
	}
	return []nats.Option{nats.PingInterval(l.PingInterval), nats.MaxPingsOutstanding(l.MaxPingsOut)}
}

// disconnected records a disconnect and its reason (nats.go's
// DisconnectErrHandler).
func (l *Liveness) disconnected(err error) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	l.last = err
	if errors.Is(err, nats.ErrStaleConnection) {
		l.stale = l.n
	}
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// Mark is the number of disconnects so far.
func (l *Liveness) Mark() uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// StaleSince reports whether the first disconnect after mark was for
// unanswered pings, waiting up to d for it to be recorded: nats.go ends
// pending flushes before it calls the handler.
func (l *Liveness) StaleSince(mark uint64, d time.Duration) bool {
	if l == nil {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		l.mu.Lock()
		n, stale := l.n, l.stale
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		ch := l.changed
		l.mu.Unlock()
		if n > mark {
			return stale == mark+1
		}
		select {
		case <-ch:
		case <-t.C:
			return false
		}
	}
}

// Last is the reason of the last disconnect, nil before any.
func (l *Liveness) Last() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}
