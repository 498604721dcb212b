package delivery

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// inboxCheck proves that the publisher receives on its inbox, where every
// answer to a core delivery arrives: without that (a NATS user denied the
// subscription, a permission slip) no delivery could be found to have
// missed, and each would count as delivered. At start and after every
// reconnect, the publisher sends requests whose answers come to a subject
// of its inbox, and waits for one; until one arrives, Connected is false, so the scanner
// claims nothing and the daemon holds no shard, and Down says why.
type inboxCheck struct {
	mu         sync.Mutex
	ok         bool   // a probe came back on the current connection
	reconnects uint64 // the connection's reconnects when it did
	err        error  // why the last probe failed; nil before the first
	off        bool   // PublisherOptions.NoInboxCheck
	// mark: the server's refusals after it (Refusals.Mark, taken before
	// the probe that proved the inbox) are read for the inbox
	// subscription's: a config reload can take it away (revoked).
	mark uint64
}

const (
	// inboxProbeWait bounds the wait for one probe.
	inboxProbeWait = 2 * time.Second
	// inboxProbeEvery is the longest pause between failed probes.
	inboxProbeEvery = 5 * time.Second
	// jsInfo is answered by the server: JetStream's account info, or a
	// no-responders status with JetStream off.
	jsInfo = "$JS.API.INFO"
)

// answerProbes subscribes to <prefix>.<random token> and answers, with an
// empty message, each request there whose reply subject is one of this
// publisher's probes: the answer comes back on its inbox whatever else
// subscribes on the server. A subscriber to ">" (nats sub '>') suppresses
// the server's no-responders status and answers nothing, so probes
// answered by the server alone never came back beside one (without
// JetStream, whose $JS.API.INFO answers), and the daemon stayed not ready.
// If the server refuses this subscription (a NATS user without
// <prefix>.internal.> to subscribe to), the server's no-responders status
// answers the probe instead; a probe to the prefix itself, where nobody
// subscribes, covers a user that may not answer (no allow_responses).
func (p *Publisher) answerProbes(prefix string) error {
	var random [9]byte
	_, _ = rand.Read(random[:])
	subject := prefix + "." + enc.EncodeToString(random[:])
	mine := p.interest.base + "probe."
	sub, err := p.nc.Subscribe(subject, func(m *nats.Msg) {
		// Only this publisher's probes: not a reflector for anyone
		// allowed to publish here.
		if strings.HasPrefix(m.Reply, mine) {
			_ = m.Respond(nil)
		}
	})
	if err != nil {
		return fmt.Errorf("bridge: subscribe to the inbox probe %s: %w", subject, err)
	}
	p.inboxProbe, p.probePrefix, p.prober = subject, prefix, sub
	return nil
}

// verified reports whether the inbox was proven on the connection as it
// is now.
func (c *inboxCheck) verified(nc *nats.Conn) bool {
	if c.off {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ok && c.reconnects == nc.Stats().Reconnects
}

// unproven says why the inbox is not proven on the connection as it is
// now, nil when it is (for Down).
func (p *Publisher) unproven() error {
	if p.inbox.verified(p.nc) {
		return nil
	}
	p.inbox.mu.Lock()
	defer p.inbox.mu.Unlock()
	if p.inbox.err == nil {
		return fmt.Errorf("not yet proven to receive on its NATS inbox %s>", p.interest.base)
	}
	return p.inbox.err
}

// checkInbox probes the inbox whenever it is not proven on the connection
// as it is now (at start, after each reconnect), until done.
func (p *Publisher) checkInbox(done <-chan struct{}) {
	status := p.nc.StatusChanged(nats.CONNECTED)
	defer p.nc.RemoveStatusListener(status)
	wait, failures := time.Duration(0), 0
	for {
		select {
		case <-done:
			return
		case <-status:
			wait = 0
		case <-time.After(wait):
		}
		if p.inbox.verified(p.nc) {
			if err := p.revoked(); err != nil {
				p.inbox.mu.Lock()
				p.inbox.ok, p.inbox.err = false, err
				p.inbox.mu.Unlock()
				p.log.Error("the server took the delivery inbox subscription away: delivering nothing and holding no shard until it works",
					"error", err)
				failures = 1 // subscribe again, then probe
				continue
			}
		}
		if !p.nc.IsConnected() || p.inbox.verified(p.nc) {
			wait = time.Second // a missed status change or a revocation is caught within a second
			continue
		}
		if failures > 0 {
			// A subscription the server refused is unknown to it, also once
			// the permission is granted: subscribe again.
			p.send.Lock()
			err := p.interest.subscribe(p.nc)
			p.send.Unlock()
			if err != nil {
				p.log.Warn("subscribing to the delivery inbox again failed", "error", err)
			}
		}
		reconnects, mark := p.nc.Stats().Reconnects, p.refusals.Mark()
		err := p.probeInbox(done)
		if err == nil {
			// Read the list of streams before the first delivery needs it.
			ctx, cancel := context.WithTimeout(context.Background(), captorsTimeout)
			p.streams.ready(ctx)
			cancel()
		}
		p.inbox.mu.Lock()
		if err == nil {
			p.inbox.ok, p.inbox.reconnects, p.inbox.err, p.inbox.mark = true, reconnects, nil, mark
		} else {
			p.inbox.ok, p.inbox.err = false, err
		}
		p.inbox.mu.Unlock()
		switch {
		case err == nil && failures > 0:
			p.log.Info("delivery inbox receives again: delivering", "inbox", p.interest.base+">")
			failures, wait = 0, time.Second
		case err == nil:
			p.log.Debug("delivery inbox receives", "inbox", p.interest.base+">")
			wait = time.Second
		default:
			if failures == 0 || failures%12 == 0 {
				p.log.Error("cannot receive on the delivery inbox: delivering nothing and holding no shard until it works",
					"error", err)
			}
			failures++
			wait = min(time.Duration(failures)*time.Second, inboxProbeEvery)
		}
	}
}

// revoked returns the server's refusal of the inbox subscription since the
// inbox was proven, nil for none: a config reload that takes the
// permission away drops the subscription and says so.
func (p *Publisher) revoked() error {
	p.inbox.mu.Lock()
	mark := p.inbox.mark
	p.inbox.mu.Unlock()
	for _, err := range p.refusals.After(mark) {
		if strings.Contains(err.Error(), `Subscription to "`+p.interest.base) {
			return err
		}
	}
	return nil
}

// probeInbox sends requests the server answers with a fresh subject of the
// inbox as their reply subject, and waits for any answer. Its error
// carries what the server refused since the subscription.
func (p *Publisher) probeInbox(done <-chan struct{}) error {
	var random [9]byte
	_, _ = rand.Read(random[:])
	subject := p.interest.base + "probe." + enc.EncodeToString(random[:])
	probed := make(chan struct{})
	p.interest.mu.Lock()
	p.interest.probe, p.interest.probed = subject, probed
	mark := p.interest.subscribed
	p.interest.mu.Unlock()
	defer func() {
		p.interest.mu.Lock()
		if p.interest.probe == subject {
			p.interest.probe = ""
		}
		p.interest.mu.Unlock()
	}()
	// Requests answered on the inbox, for NATS users allowed either
	// (docs/security.md's daemon block allows both): JetStream's account
	// info (or the server's no-responders status), and this publisher's
	// own probe subject (answered by answerProbes, whose reply the block's
	// allow_responses lets through). Not a publish to the inbox itself:
	// that block does not allow it, and a refusal on every reconnect would
	// be an error in the log to learn to ignore.
	_ = p.nc.PublishRequest(jsInfo, subject, nil)
	if p.inboxProbe != "" {
		_ = p.nc.PublishRequest(p.inboxProbe, subject, nil)
		// Nobody subscribes to the prefix itself: the server's
		// no-responders status answers, for a NATS user whose answer to
		// its own probe is refused (no allow_responses).
		_ = p.nc.PublishRequest(p.probePrefix, subject, nil)
	}
	_ = p.nc.FlushTimeout(inboxProbeWait)
	t := time.NewTimer(inboxProbeWait)
	defer t.Stop()
	select {
	case <-probed:
		return nil
	case <-done:
		return errors.New("stopped")
	case <-t.C:
	}
	why := []string{}
	for _, err := range p.refusals.After(mark) {
		if s := err.Error(); strings.Contains(s, p.interest.base) || strings.Contains(s, jsInfo) ||
			(p.inboxProbe != "" && (strings.Contains(s, `"`+p.inboxProbe+`"`) || strings.Contains(s, `"`+p.probePrefix+`"`))) {
			why = append(why, s)
		}
	}
	if !p.nc.IsConnected() {
		why = append(why, "the connection dropped")
	}
	if len(why) == 0 {
		why = append(why, "no reason given by the server")
	}
	return fmt.Errorf("no probe came back on its inbox %s> within %s: %s", p.interest.base, inboxProbeWait, strings.Join(why, "; "))
}
