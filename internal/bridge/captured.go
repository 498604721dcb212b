package bridge

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/envelope"
)

// captors knows which core targets a JetStream stream captures, so that
// a delivery to one waits for the stream's answer (stored or refused)
// before it counts: the answer comes from the stream's own goroutine, often
// after the flush that confirms the publish. It lists the streams of
// delayd's account ($JS.API.STREAM.LIST), at most captorsEvery apart,
// and learns the targets that a stream answered for (a stream of another
// account, importing the subject, is never listed).
type captors struct {
	js       jetstream.JetStream
	refusals *Refusals
	log      hclog.Logger

	mu       sync.Mutex
	patterns []capture // from the last list read
	memo     map[string]bool
	learned  map[string]time.Time // answered by a stream, not in the list
	listed   time.Time            // when the last list was asked for
	failing  error                // the last failure, logged once
	running  chan struct{}        // closed when the list being read is in
	poked    time.Time            // the last refresh an unexpected answer asked for
	warned   time.Time            // the last late refusal logged
	late     int                  // late refusals since
}

type capture struct {
	pattern string
	noAck   bool // the stream never answers
}

const (
	// captorsEvery bounds the age of the list: a stream created since is
	// known from its first answer to a delivery that still waits (or a
	// late one, which asks for a new list).
	captorsEvery = 10 * time.Second
	// captorsTimeout bounds one read of the list.
	captorsTimeout = 2 * time.Second
	// learnedFor is how long a target a stream answered for stays
	// captured without a new answer.
	learnedFor = 10 * time.Minute
	// memoMax bounds the memo of targets looked up.
	memoMax = 1 << 16
)

func newCaptors(js jetstream.JetStream, refusals *Refusals, log hclog.Logger) *captors {
	return &captors{js: js, refusals: refusals, log: log, memo: map[string]bool{}, learned: map[string]time.Time{}}
}

// streamList is the subject of the list request, which needs delayd's
// NATS user's permission to publish.
const streamList = "$JS.API.STREAM.LIST"

// ready reads the list of streams when it is older than captorsEvery. It
// waits for it (bounded by ctx and captorsTimeout) only when no list was
// ever read: later reads go on beside the deliveries, so a slow JetStream
// API never holds them (the list is then up to captorsEvery plus one read
// old).
func (c *captors) ready(ctx context.Context) {
	c.mu.Lock()
	running := c.running
	wait := c.listed.IsZero()
	if running == nil && time.Since(c.listed) >= captorsEvery {
		running = c.refreshLocked()
	}
	c.mu.Unlock()
	if running == nil || !wait {
		return
	}
	select {
	case <-running:
	case <-ctx.Done():
	}
}

// refreshLocked starts reading the list. Under mu.
func (c *captors) refreshLocked() chan struct{} {
	c.listed = time.Now()
	done := make(chan struct{})
	c.running = done
	go func() {
		defer close(done)
		patterns, err := c.list()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.running = nil
		if err != nil {
			if c.failing == nil || c.failing.Error() != err.Error() {
				c.log.Warn("cannot list the JetStream streams: a stream that captures a core target is known only "+
					"once it answered a delivery, so its first refusals may count as delivered "+
					"(grant delayd's NATS user $JS.API.STREAM.LIST)", "error", err)
			}
			c.failing = err
			return
		}
		if c.failing != nil {
			c.log.Info("JetStream streams listed again")
		}
		c.patterns, c.failing = patterns, nil
		clear(c.memo)
	}()
	return done
}

// list reads which subjects the account's streams capture. JetStream off
// (for the server or the account) is an empty list: no stream captors.
func (c *captors) list() ([]capture, error) {
	ctx, cancel := context.WithTimeout(context.Background(), captorsTimeout)
	defer cancel()
	// A refused request gets no answer: the server's -ERR says it at once.
	mark := c.refusals.mark()
	l := c.js.ListStreams(ctx)
	var out []capture
	for infos := l.Info(); infos != nil; {
		changed, refused := c.refusals.refusedSince(mark, streamList)
		if refused != nil {
			cancel()
			for range infos { // the lister ends on the cancel
			}
			return nil, refused
		}
		select {
		case info, ok := <-infos:
			if !ok {
				infos = nil
				break
			}
			for _, s := range info.Config.Subjects {
				out = append(out, capture{pattern: s, noAck: info.Config.NoAck})
			}
		case <-changed:
		}
	}
	err := l.Err()
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		return nil, nil
	}
	return out, err
}

// captured reports whether a delivery to target should wait for a
// stream's answer: a listed stream without no_ack captures it, or a stream
// answered for it lately.
func (c *captors) captured(target string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at, ok := c.learned[target]; ok {
		if time.Since(at) < learnedFor {
			return true
		}
		delete(c.learned, target)
	}
	if v, ok := c.memo[target]; ok {
		return v
	}
	v := false
	for _, p := range c.patterns {
		if envelope.Match(p.pattern, target) {
			v = !p.noAck
			break
		}
	}
	if len(c.memo) >= memoMax {
		clear(c.memo)
	}
	c.memo[target] = v
	return v
}

// heard is told of every stream answer to a delivery: target, or "" when
// the answer came after its batch ended (or was forged). A target that no
// listed stream captors is learned, and the list read again (at most once
// a second), since a stream may have been created since.
func (c *captors) heard(target string, a verdict, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if target == "" {
		if a == refused {
			// At most one line in 10 s: anyone allowed to publish to
			// delayd's inbox can send these.
			if c.late++; time.Since(c.warned) >= 10*time.Second {
				c.log.Warn("a stream refused a core delivery after its batch was confirmed, or an answer was forged: "+
					"if it was not forged, that delivery is lost", "error", reason, "count", c.late)
				c.warned, c.late = time.Now(), 0
			}
		}
	} else if !c.memo[target] {
		c.learned[target] = time.Now()
	} else {
		return
	}
	if c.running == nil && time.Since(c.poked) >= time.Second {
		c.poked = time.Now()
		c.refreshLocked()
	}
}

// forget drops a learned target whose stream did not answer: it may have
// been deleted, and a target without a stream must not wait for one.
func (c *captors) forget(target string) {
	c.mu.Lock()
	delete(c.learned, target)
	c.mu.Unlock()
}

// expire makes the next ready read the list again, and wait for it.
func (c *captors) expire() {
	c.mu.Lock()
	c.listed = time.Time{}
	c.mu.Unlock()
}
