package bridge

// A silent path: the sockets stay open but no byte passes (a dead switch,
// a paused VM, a conntrack drop). No error ends such a connection; only
// unanswered round trips show it. Deliveries made into one count as never
// sent, as during any NATS outage, and the daemon stops claiming.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/scanner"
)

// errSilent marks deliveries that got no confirmation while the path to
// NATS was silent: no answer came back at all, so they count as never
// sent (scanner.ErrUnreachable), like deliveries during an outage.
var errSilent = fmt.Errorf("NATS path silent: %w", scanner.ErrUnreachable)

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

// mark is the number of disconnects so far.
func (l *Liveness) mark() uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// staleSince reports whether the first disconnect after mark was for
// unanswered pings, waiting up to d for it to be recorded: nats.go ends
// pending flushes before it calls the handler.
func (l *Liveness) staleSince(mark uint64, d time.Duration) bool {
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

// probeEvery is how often a publisher that found its path silent tries a
// round trip again.
const probeEvery = 100 * time.Millisecond

// Down says why this publisher cannot deliver now (nil: it can): its path
// is silent, its connection is down, with the reason nats.go gave, or it
// has not proven yet that it receives on its inbox (inbox.go).
func (p *Publisher) Down() error {
	if err := p.whySilent(); err != nil {
		return err
	}
	if p.nc.IsConnected() {
		return p.unproven()
	}
	var last error
	if p.live != nil {
		p.live.mu.Lock()
		last = p.live.last
		p.live.mu.Unlock()
	}
	if last != nil {
		return fmt.Errorf("the NATS delivery connection is down (last disconnect: %v)", last)
	}
	return errors.New("the NATS delivery connection is down")
}

// whySilent returns why the path to NATS counts as silent, nil while it does
// not: this publisher then reports itself not connected.
func (p *Publisher) whySilent() error {
	p.silentMu.Lock()
	defer p.silentMu.Unlock()
	return p.silent
}

// flush confirms a batch (mark: the connection's disconnects when it
// began). It waits for the round trip until the batch's deadline and, if
// the answer has not come by then, up to the probe time more: an answer
// then shows a slow path, and the batch fails as an attempt (its messages
// reached NATS); none shows a silent one, and the batch fails with
// errSilent, never sent as far as anyone can tell. A connection nats.go
// drops meanwhile for unanswered pings is a silent path too; one the
// server closes is not (what was written may have been delivered).
func (p *Publisher) flush(ctx context.Context, mark uint64) (err, silent error) {
	deadline, ok := ctx.Deadline()
	if p.probe <= 0 || !ok {
		return p.nc.FlushWithContext(ctx), nil
	}
	fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(p.probe))
	defer cancel()
	start := time.Now()
	err = p.nc.FlushWithContext(fctx)
	switch {
	case err == nil && ctx.Err() != nil:
		return fmt.Errorf("confirmed %s after the flush began, past its deadline", time.Since(start).Round(time.Millisecond)), nil
	case err == nil, p.nc.IsClosed():
		return err, nil
	case isTimeout(err):
		return err, p.goSilent(fmt.Errorf("%w: no answer to a flush within its deadline and %s more", errSilent, p.probe))
	case errors.Is(err, nats.ErrConnectionClosed) && p.live.staleSince(mark, p.probe):
		return err, p.goSilent(fmt.Errorf("%w: %d pings in a row unanswered", errSilent, p.live.MaxPingsOut+1))
	}
	return err, nil
}

func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// goSilent marks the path silent with why, until a round trip is answered
// within the probe time again, and returns why.
func (p *Publisher) goSilent(why error) error {
	p.silentMu.Lock()
	defer p.silentMu.Unlock()
	if p.silent == nil {
		p.silent = why
		go p.watchSilence()
	}
	return why
}

// watchSilence tries a round trip every probeEvery and ends the silence
// when one is answered within the probe time: a tighter bound than a
// delivery's (half the lease), so a path too slow to deliver stays down
// instead of flapping.
func (p *Publisher) watchSilence() {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-p.closed:
			return
		case <-t.C:
		}
		if p.nc.IsConnected() && p.nc.FlushTimeout(p.probe) == nil {
			p.silentMu.Lock()
			p.silent = nil
			p.silentMu.Unlock()
			return
		}
	}
}
