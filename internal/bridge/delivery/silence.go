package delivery

// A silent path: the sockets stay open but no byte passes (a dead switch,
// a paused VM, a conntrack drop). No error ends such a connection; only
// unanswered round trips show it. Deliveries made into one count as never
// sent, as during any NATS outage, and the daemon stops claiming.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/scanner"
)

// errSilent marks deliveries that got no confirmation while the path to
// NATS was silent: no answer came back at all, so they count as never
// sent (scanner.ErrUnreachable), like deliveries during an outage.
var errSilent = fmt.Errorf("NATS path silent: %w", scanner.ErrUnreachable)

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
	if last := p.live.Last(); last != nil {
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
	case errors.Is(err, nats.ErrConnectionClosed) && p.live.StaleSince(mark, p.probe):
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
