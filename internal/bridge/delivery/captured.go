package delivery

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/ratelog"
)

// captors knows which core targets a JetStream stream captures, so that
// a delivery to one waits for the stream's answer (stored or refused)
// before it counts: the answer comes from the stream's own goroutine, often
// after the flush that confirms the publish. It lists the streams of
// delayd's account ($JS.API.STREAM.LIST), at most captorsEvery apart,
// and learns the targets that a stream answered for (a stream of another
// account, importing the subject, is never listed). A subject mapping of
// the account (capm.x → capm.y) is invisible to clients: a stream on the
// mapped subject captures a target its listed subjects do not match. So
// while the account has a stream, the first delivery to a target no
// listed stream matches is a probe: it waits up to answerWindow for a
// stream's answer; none, and the target counts as not captured for
// learnedFor (or until the list changes).
type captors struct {
	js       jetstream.JetStream
	refusals *bridge.Refusals
	log      hclog.Logger
	own      string // the name of delayd's intake stream (capture.own)

	mu       sync.Mutex
	patterns []capture       // from the last list read
	names    map[string]bool // the streams of the last list read
	memo     map[string]match
	learned  map[string]answer // answered by a listed stream its subjects do not match
	// unlisted: answered by a stream the list did not name when the answer
	// came. Anyone who sees a delivery's reply subject can answer on it,
	// so the target is learned only once a list read after it names the
	// stream.
	unlisted map[string]answer
	unheard  map[string]time.Time // probed: no stream answered
	anyAck   bool                 // a listed stream answers (not no_ack)
	listed   time.Time            // when the last list was asked for
	failing  error                // the last failure, logged once
	running  chan struct{}        // closed when the list being read is in
	poked    time.Time            // the last refresh an unexpected answer asked for
	lateLog  *ratelog.Limiter     // late refusals: one line per lateLogEvery
}

// answer is a stream's answer for a target: when, and which stream it
// named. missed: an answer awaited since did not come (gone), so later
// deliveries do not wait for it, while gone still judges by its stream.
type answer struct {
	at     time.Time
	stream string
	missed bool
}

type capture struct {
	pattern string
	noAck   bool // the stream never answers
	// own: delayd's own intake stream. A target it captures is awaited
	// like any other, but it alone does not make unknown targets probed:
	// nothing maps a target into it, and every account with a durable
	// intake has it, so every first delivery to a new subject would wait.
	own bool
}

// match is what the listed streams say of a target.
type match uint8

const (
	unmatched  match = iota // no listed stream's subjects match it
	matchAck                // a listed stream captures it and answers
	matchNoAck              // a listed no_ack stream captures it: no answer comes
)

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
	// memoMax bounds the memo of targets looked up, and the targets
	// probed.
	memoMax = 1 << 16
	// answerWindow is how long a probe waits for a stream's answer after
	// its batch is confirmed otherwise: a stream answers from its own
	// goroutine, within a millisecond on an idle server. An answer later
	// than this is late: the target is learned, but that delivery was
	// counted (its refusal is logged as a loss).
	answerWindow = 100 * time.Millisecond
	// listedWindow is how long a delivery to a target that a listed stream
	// captures waits for its answer: longer than answerWindow, since a
	// loaded server answers later and a delivery failed for it goes out
	// again (stored twice). The list comes from the account, not from
	// answers, so no consumer can make its target wait this long; a
	// deleted stream costs its batches this once (gone).
	listedWindow = time.Second
	// lateLogEvery is the least time between two lines about late
	// refusals.
	lateLogEvery = 10 * time.Second
)

func newCaptors(js jetstream.JetStream, refusals *bridge.Refusals, log hclog.Logger, own string) *captors {
	return &captors{js: js, refusals: refusals, log: log, own: own, memo: map[string]match{}, learned: map[string]answer{},
		unlisted: map[string]answer{}, unheard: map[string]time.Time{}, lateLog: ratelog.New(lateLogEvery, nil)}
}

// streamList is the subject of the list request, which needs delayd's
// NATS user's permission to publish.
const streamList = "$JS.API.STREAM.LIST"

// ready reads the list of streams when it is older than captorsEvery. It
// waits for it (bounded by ctx and captorsTimeout) only until a first read
// is in, read or failed (every caller meanwhile, not only the one that
// began it): later reads go on beside the deliveries, so a slow JetStream
// API never holds them (the list is then up to captorsEvery plus one read
// old).
func (c *captors) ready(ctx context.Context) {
	c.mu.Lock()
	running := c.running
	wait := c.names == nil && c.failing == nil
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
	began := c.listed
	done := make(chan struct{})
	c.running = done
	go func() {
		defer close(done)
		patterns, names, err := c.list()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.running = nil
		if errors.Is(err, nats.ErrNoResponders) && len(c.names) == 0 {
			// No JetStream server answers and none ever listed a stream:
			// a core-only NATS, where no stream can answer a delivery.
			err = nil
		}
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
		if !slices.Equal(c.patterns, patterns) {
			clear(c.unheard) // a new stream may capture a probed target through a mapping
		}
		c.patterns, c.names, c.failing = patterns, names, nil
		c.anyAck = slices.ContainsFunc(patterns, func(p capture) bool { return !p.noAck && !p.own })
		clear(c.memo)
		for target, u := range c.unlisted {
			switch {
			case names[u.stream]:
				c.learned[target] = u
				delete(c.unheard, target)
			case u.at.After(began):
				continue // came after this read began: the next one decides
			}
			delete(c.unlisted, target)
		}
	}()
	return done
}

// list reads which subjects the account's streams capture. JetStream off
// (for the server or the account) is an empty list: no stream captors.
func (c *captors) list() ([]capture, map[string]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), captorsTimeout)
	defer cancel()
	// A refused request gets no answer: the server's -ERR says it at once.
	mark := c.refusals.Mark()
	l := c.js.ListStreams(ctx)
	var out []capture
	names := map[string]bool{}
	for infos := l.Info(); infos != nil; {
		changed, refused := c.refusals.RefusedSince(mark, streamList)
		if refused != nil {
			cancel()
			for range infos { // the lister ends on the cancel
			}
			return nil, nil, refused
		}
		select {
		case info, ok := <-infos:
			if !ok {
				infos = nil
				break
			}
			names[info.Config.Name] = true
			for _, s := range info.Config.Subjects {
				out = append(out, capture{pattern: s, noAck: info.Config.NoAck, own: info.Config.Name == c.own})
			}
		case <-changed:
		}
	}
	err := l.Err()
	// A server that says JetStream is off speaks for the account. No
	// responders says only that no JetStream server is reachable now (a
	// core-only NATS, or a leaf node whose link to the hub is down): the
	// caller tells the two apart by what it listed before.
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		return nil, map[string]bool{}, nil // read: no stream (ready waits only until a read is in)
	}
	return out, names, err
}

// wait is how a delivery waits for a stream's answer after its flush.
type wait uint8

const (
	noWait      wait = iota
	waitProbe        // no listed stream matches it, but one may through a mapping: up to answerWindow
	waitLearned      // a stream answered for it lately: up to answerWindow
	waitListed       // a listed stream without no_ack captures it: up to listedWindow
)

// waitFor says how a delivery to target waits for a stream's answer: a
// probe when no listed stream matches it, but the account has a stream
// that answers (or its streams cannot be listed) and no probe of it went
// unanswered lately.
func (c *captors) waitFor(target string) wait {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.matchLocked(target)
	if m == matchAck {
		return waitListed
	}
	if l, ok := c.learned[target]; ok {
		switch {
		case time.Since(l.at) >= learnedFor:
			delete(c.learned, target)
		case !l.missed:
			return waitLearned
		}
	}
	if _, ok := c.unlisted[target]; ok && c.running != nil && m != matchNoAck {
		// A stream the list did not name answered for it, and the list
		// read that answer asked for is on its way: until it is in, a
		// delivery waits as a probe, or a stream created since would have
		// its refusals counted as delivered. A forged answer costs its own
		// target this, and only while one read runs.
		return waitProbe
	}
	if m == matchNoAck || (!c.anyAck && c.failing == nil) {
		return noWait
	}
	if at, ok := c.unheard[target]; ok {
		if time.Since(at) < learnedFor {
			return noWait
		}
		delete(c.unheard, target)
	}
	return waitProbe
}

// matchLocked is what the listed streams say of target. Under mu.
func (c *captors) matchLocked(target string) match {
	m, ok := c.memo[target]
	if ok {
		return m
	}
	for _, p := range c.patterns {
		if envelope.Match(p.pattern, target) {
			m = matchAck
			if p.noAck {
				m = matchNoAck
			}
			break
		}
	}
	if len(c.memo) >= memoMax {
		clear(c.memo)
	}
	c.memo[target] = m
	return m
}

// unanswered records that a probe of target heard no stream.
func (c *captors) unanswered(target string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.unheard) >= memoMax {
		clear(c.unheard)
	}
	c.unheard[target] = time.Now()
}

// heard is told of every stream answer to a delivery: its target (late:
// the answer came after the delivery's batch ended, and the delivery was
// counted), or "" when the answer cannot be placed (too old, or forged),
// and the stream it names. A target that no listed stream captures is
// learned, so later deliveries to it wait for the stream, when the answer
// names a listed stream. Anyone who sees a delivery's reply subject can
// answer on it, so an unlisted name is believed only once the list, read
// again (at most once a second), names it; while the list cannot be read
// at all, answers are believed as they come.
func (c *captors) heard(target string, a verdict, reason, stream string, late bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if (target == "" || late) && a == refused {
		// At most one line per lateLogEvery: the answers can come in floods.
		if ok, n := c.lateLog.Note(1); ok {
			if target == "" {
				c.log.Warn("a stream refused a core delivery after its batch was confirmed, or an answer was forged: "+
					"if it was not forged, that delivery is lost", "error", reason, "count", n)
			} else {
				c.log.Warn("a stream refused a core delivery after its batch was confirmed, or its consumer forged "+
					"the answer: if it was not forged, that delivery is lost", "target", target, "error", reason, "count", n)
			}
		}
	}
	switch {
	case target == "" || c.matchLocked(target) == matchAck:
		return
	case c.names[stream] || c.failing != nil:
		if len(c.learned) >= memoMax {
			clear(c.learned)
		}
		c.learned[target] = answer{at: time.Now(), stream: stream}
		delete(c.unheard, target)
		return
	}
	if len(c.unlisted) >= memoMax {
		clear(c.unlisted)
	}
	c.unlisted[target] = answer{at: time.Now(), stream: stream}
	c.pokeLocked()
}

// pokeLocked starts reading the list again unless a read is running or one
// was asked for less than a second ago, and returns the read running, if
// any. Under mu.
func (c *captors) pokeLocked() chan struct{} {
	if c.running == nil && time.Since(c.poked) >= time.Second {
		c.poked = time.Now()
		c.refreshLocked()
	}
	return c.running
}

// gone is asked of a delivery whose awaited stream answer did not come in
// time: it reads the list again (at most once a second; a deleted stream
// answers nothing, and without this every delivery to its targets would
// wait and fail until the next periodic read) and reports whether the
// stream that captured target is gone, so that the flush's confirmation
// stands. Its verdict depends on the state alone, never on an earlier
// call for the same target (a batch may carry several): still captured
// by a listed stream's subjects, or learned from a stream still listed,
// is not gone; a read that failed or is not in within answerWindow cannot
// tell, and is not gone either. A learned target is marked missed: later
// deliveries to it do not wait for the stream that stopped answering.
func (c *captors) gone(ctx context.Context, target string) bool {
	c.mu.Lock()
	running := c.pokeLocked()
	c.mu.Unlock()
	if running != nil {
		t := time.NewTimer(answerWindow)
		defer t.Stop()
		select {
		case <-running:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l, learned := c.learned[target]
	if learned && !l.missed {
		l.missed = true
		c.learned[target] = l
	}
	switch {
	case c.failing != nil:
		return false
	case c.matchLocked(target) == matchAck:
		return false
	case learned:
		return !c.names[l.stream]
	}
	return true
}
