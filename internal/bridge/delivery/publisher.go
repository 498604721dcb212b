package delivery

import (
	"context"
	"fmt"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/scanner"
)

// errNotConnected is returned for deliveries attempted while NATS is down:
// nats.go would buffer them, and a buffered publish is not a delivery.
var errNotConnected = fmt.Errorf("NATS not connected: %w", scanner.ErrUnreachable)

// errInboxUnproven is returned for deliveries attempted before the
// publisher proved it receives on its inbox (see inboxCheck): nothing is
// sent, as a missing subscriber could not be told from a delivered one.
var errInboxUnproven = fmt.Errorf("not yet proven to receive on the NATS delivery inbox: %w", scanner.ErrUnreachable)

// Publisher delivers due envelopes: over core NATS, or with the JetStream
// API to targets matching the configured patterns.
type Publisher struct {
	// send serialises the writing of concurrent batches, so that each
	// batch's messages are contiguous and its refusal mark comes before
	// them. Its flush round trip, the PubAcks and the stream answers are
	// waited for outside it: on a slow path batches overlap, and a batch
	// costs one round trip, not one per batch ahead of it (issue 36).
	send sync.Mutex
	// sent records the subjects batches published to: a refusal a batch
	// sees of a subject it did not publish is placed when another batch,
	// overlapping it, did (the server answers each batch's refusals before
	// the PONG of its flush, which that batch then reads).
	sentMu     sync.Mutex
	sent       map[string]struct{}
	nc         *nats.Conn
	refusals   *bridge.Refusals
	js         jetstream.JetStream
	jsPatterns []string
	plain      []string // fire-and-forget patterns
	interest   *interest
	streams    *captors
	// A silent path (silence.go): live records the connection's stale
	// disconnects, probe bounds the round trip that tells silent from
	// slow, silent says why the path counts as silent (nil: it does not).
	live     *bridge.Liveness
	probe    time.Duration
	silentMu sync.Mutex
	silent   error
	closed   chan struct{}
	// The inbox self-check (inbox.go).
	inbox       inboxCheck
	inboxProbe  string             // the subject this publisher answers its probes on
	probePrefix string             // PublisherOptions.InboxProbe, where nobody subscribes
	prober      *nats.Subscription // on inboxProbe
	log         hclog.Logger
}

// PublisherOptions pick how each target is delivered.
type PublisherOptions struct {
	// JetStream lists the patterns of targets published with the
	// JetStream API: confirmed by their PubAck.
	JetStream []string
	// FireAndForget lists the patterns of core targets published without
	// the interest check: a delivery nobody subscribed to counts as
	// delivered. Every other core delivery that reaches no subscriber
	// fails with scanner.ErrNoInterest.
	FireAndForget []string
	// InboxProbe, if set, is the prefix of a subject the publisher
	// answers itself (delayd's <prefix>.internal.probe, to which it adds
	// a random token): a request to it, answered by the publisher (or by
	// the server's no-responders status if that subscription is refused),
	// is one of the inbox self-check's probes.
	InboxProbe string
	// NoInboxCheck skips the inbox self-check (see inboxCheck), for a
	// daemon that does not deliver (mode intake): Connected is then the
	// connection's state alone.
	NoInboxCheck bool
	// IntakeStream names delayd's own intake stream: listed with the
	// others, but not a reason to probe targets no stream lists.
	IntakeStream string
	// Log, if not nil, tells what the publisher cannot see (its inbox,
	// the streams it cannot list, a stream's late refusal).
	Log hclog.Logger
	// bridge.Liveness is the one given to bridge.Connect for the connection, if any.
	Liveness *bridge.Liveness
	// Probe: a flush unconfirmed at its deadline is followed by one more
	// round trip given this long; unanswered too, the path counts as
	// silent (errSilent) until a round trip is answered within it again.
	// 0: never (every unconfirmed flush is an attempt).
	Probe time.Duration
}

// NewPublisher returns a publisher on nc, whose permission refusals are
// recorded in refusals (see bridge.Connect). It subscribes to a subject of nc's
// inbox for the answers to core deliveries; Close ends that.
func NewPublisher(nc *nats.Conn, refusals *bridge.Refusals, o PublisherOptions) (*Publisher, error) {
	log := o.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("bridge: jetstream: %w", err)
	}
	p := &Publisher{nc: nc, refusals: refusals, js: js, jsPatterns: o.JetStream, plain: o.FireAndForget,
		streams: newCaptors(js, refusals, log, o.IntakeStream), live: o.Liveness, probe: o.Probe, closed: make(chan struct{}),
		inboxProbe: o.InboxProbe, log: log}
	in, err := newInterest(nc, refusals, p.streams.heard)
	if err != nil {
		return nil, err
	}
	p.interest = in
	if o.InboxProbe != "" && !o.NoInboxCheck {
		if err := p.answerProbes(o.InboxProbe); err != nil {
			in.close()
			return nil, err
		}
	}
	if o.NoInboxCheck {
		p.inbox.off = true
	} else {
		go p.checkInbox(p.closed)
	}
	return p, nil
}

// Close stops the interest check; the connection stays open.
func (p *Publisher) Close() {
	close(p.closed)
	p.interest.close()
	if p.prober != nil {
		_ = p.prober.Unsubscribe()
	}
}

// Publish sends every delivery and confirms each. A core NATS delivery is
// confirmed by one flush round trip: the PONG comes back only after the
// server processed everything sent before the PING, and after the
// no-responders status of each delivery that reached no subscriber (see
// interest), which fails with scanner.ErrNoInterest. A core delivery to a
// target a stream captures is confirmed by the stream's PubAck, and fails
// with the stream's error when it refuses. JetStream deliveries are
// confirmed by their PubAck; their Nats-Msg-Id (id@due) makes the stream
// drop a redelivery inside its duplicate window. A batch sent into a
// silent path fails with errSilent, not an attempt (silence.go).
func (p *Publisher) Publish(ctx context.Context, ds []envelope.Delivery) []error {
	errs := make([]error, len(ds))
	if !p.Connected() {
		err := p.whySilent()
		switch {
		case err != nil:
		case p.nc.IsConnected():
			err = errInboxUnproven
		default:
			err = errNotConnected
		}
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	kinds := make([]kind, len(ds))
	checked := 0
	for i, d := range ds {
		switch {
		case envelope.MatchAny(p.jsPatterns, d.Target):
			kinds[i] = viaJetStream
		case envelope.MatchAny(p.plain, d.Target):
			kinds[i] = fireAndForget
		default:
			kinds[i] = checkedCore
			checked++
		}
	}
	if checked > 0 {
		p.streams.ready(ctx)
	}
	core := 0
	p.send.Lock()
	// Also for batches that waited here while the one before found the
	// path silent: nothing of them is written.
	if err := p.whySilent(); err != nil {
		p.send.Unlock()
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	liveMark := p.live.Mark()
	// mark before the last error: an error recorded between the two is
	// then after the mark, where since looks for it.
	mark := p.refusals.Mark()
	lastErr := p.nc.LastError()
	b, dropped := p.interest.begin(ds, func(i int) wait {
		if kinds[i] != checkedCore {
			return noWait
		}
		return p.streams.waitFor(ds[i].Target)
	})
	futures := map[int]jetstream.PubAckFuture{}
	for i, d := range ds {
		m := deliveryMsg(d)
		if kinds[i] == viaJetStream {
			// No client-side retries on "no responders": a target without a
			// stream would hold up every other delivery of the batch; the
			// scanner retries with its own backoff.
			futures[i], errs[i] = p.js.PublishMsgAsync(m, jetstream.WithMsgID(msgID(d)), jetstream.WithRetryAttempts(0))
			continue
		}
		if kinds[i] == checkedCore {
			m.Reply = b.reply(i)
		}
		if errs[i] = p.nc.PublishMsg(m); errs[i] == nil {
			core++
		}
	}
	p.noteSent(ds)
	p.send.Unlock()
	// A flush also when the batch is JetStream only: a refused JetStream
	// publish gets no PubAck, and without the server's -ERR before the
	// PONG its future would only end at the deadline, holding every
	// delivery behind it.
	if core > 0 || len(futures) > 0 {
		if err, silent := p.flush(ctx, liveMark); err != nil {
			if silent != nil {
				// Nothing came back from NATS: an outage, not attempts.
				for i := range errs {
					if errs[i] == nil {
						errs[i] = silent
					}
				}
				p.interest.unawaited(b, errs)
				p.interest.settle(ctx, b, 0, 0) // ends the batch: every delivery failed
				return errs
			}
			// Unconfirmed: the messages were handed to the connection and
			// may have left, so this is an attempt (a redelivery carries a
			// higher Delayd-Attempt), not "unreachable".
			for i := range ds {
				if errs[i] == nil && kinds[i] != viaJetStream { // JetStream ones await their PubAck
					errs[i] = fmt.Errorf("flush not confirmed: %w", err)
				}
			}
		}
		p.permissionDenied(ctx, ds, errs, futures, lastErr, mark)
	}
	if checked > 0 {
		p.noInterest(ctx, b, ds, kinds, errs, dropped)
	}
	p.streamAnswers(ctx, b, ds, kinds, errs)
	for i, f := range futures {
		if errs[i] != nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs[i] = fmt.Errorf("jetstream publish to %s: %w", ds[i].Target, err)
		case <-ctx.Done():
			errs[i] = fmt.Errorf("jetstream publish to %s: no PubAck: %w", ds[i].Target, ctx.Err())
		}
	}
	return errs
}

// kind is how a delivery is published and confirmed.
type kind uint8

const (
	checkedCore   kind = iota // core NATS, with a reply subject for its answers
	fireAndForget             // core NATS, no reply subject: the flush confirms it
	viaJetStream              // the JetStream API: its PubAck confirms it
)

// permissionDenied fails the core deliveries the server refused to take
// from delayd's NATS user: every refusal since mark, by subject. Any change
// of the connection's last error during the batch (a refusal, or another
// error that may have followed one) makes it wait for the async record to
// catch up. A refusal naming no target of the batch, or a record that
// cannot catch up in time, fails every core delivery of the batch (to be
// retried) rather than let a refused one count as delivered.
func (p *Publisher) permissionDenied(ctx context.Context, ds []envelope.Delivery, errs []error, js map[int]jetstream.PubAckFuture, before error, mark uint64) {
	last := p.nc.LastError()
	advanced := p.refusals.Mark() > mark // errors recorded during the batch
	if (last == nil || last == before) && !advanced {
		return
	}
	wait := last
	if last == before {
		// The same value again (a sentinel such as a slow consumer, or a
		// reconnect that cleared it): use what was recorded, no wait.
		wait = nil
	}
	refused, complete := p.refusals.Since(ctx, mark, wait)
	targets := make(map[string]bool, len(ds))
	for _, d := range ds {
		targets[d.Target] = true
	}
	for subj := range refused {
		// The list of streams and the inbox probes are the publisher's
		// own requests.
		own := subj == streamList || subj == jsInfo || (subj != "" && (subj == p.inboxProbe || subj == p.probePrefix)) ||
			strings.HasPrefix(subj, p.interest.base)
		if !targets[subj] && !own && !p.wasSent(subj) {
			complete = false // refused something we cannot place
		}
	}
	for i, d := range ds {
		if errs[i] != nil {
			continue
		}
		err, ok := refused[d.Target]
		if _, isJS := js[i]; isJS {
			// A refused JetStream publish never gets its PubAck: fail it
			// now. One that was not refused waits for its PubAck as usual.
			if ok {
				errs[i] = fmt.Errorf("jetstream publish to %s: %w", d.Target, err)
			}
			continue
		}
		if ok {
			errs[i] = fmt.Errorf("publish to %s: %w", d.Target, err)
		} else if !complete {
			errs[i] = fmt.Errorf("publish to %s: the server reported an error in this batch that could not be attributed: %w", d.Target, last)
		}
	}
}

// noteSent records the subjects a batch published to (sent).
func (p *Publisher) noteSent(ds []envelope.Delivery) {
	p.sentMu.Lock()
	defer p.sentMu.Unlock()
	if p.sent == nil || len(p.sent) >= memoMax {
		// Forgetting only makes a refusal of an overlapping batch
		// unplaceable: its batch's core deliveries are retried.
		p.sent = map[string]struct{}{}
	}
	for _, d := range ds {
		p.sent[d.Target] = struct{}{}
	}
}

// wasSent reports whether a batch published to subject.
func (p *Publisher) wasSent(subject string) bool {
	p.sentMu.Lock()
	defer p.sentMu.Unlock()
	_, ok := p.sent[subject]
	return ok
}

// noInterest fails the checked deliveries of the batch that reached no
// subscriber, once their statuses are all in. If that cannot be known, the
// checked deliveries not failed already fail too, to be retried: a
// duplicate is better than a delivery counted that reached no one.
func (p *Publisher) noInterest(ctx context.Context, b *batch, ds []envelope.Delivery, kinds []kind, errs []error, dropped int) {
	ok := p.interest.flushed(ctx, b, dropped)
	for i, d := range ds {
		if kinds[i] != checkedCore || errs[i] != nil {
			continue
		}
		switch {
		case p.interest.verdict(b, i) == noResponders:
			errs[i] = errNoInterest(d.Target)
		case !ok:
			errs[i] = fmt.Errorf("publish to %s: whether it reached a subscriber is unknown (statuses not all read in time, or dropped)", d.Target)
		}
	}
	p.interest.unawaited(b, errs)
}

// streamAnswers waits for the answers of the streams that capture the
// batch's checked deliveries, and fails those a stream refused, whether
// awaited or not (an answer that comes after this is dropped). An awaited
// answer that did not come by the deadline leaves the delivery unconfirmed:
// failed, to be retried, as stored or refused is unknown.
func (p *Publisher) streamAnswers(ctx context.Context, b *batch, ds []envelope.Delivery, kinds []kind, errs []error) {
	verdicts, reasons, missing, unheard := p.interest.settle(ctx, b, answerWindow, listedWindow)
	for i, d := range ds {
		if kinds[i] != checkedCore || errs[i] != nil {
			continue
		}
		switch {
		case verdicts[i] == refused:
			errs[i] = fmt.Errorf("publish to %s: %s", d.Target, reasons[i])
		case missing[i] && !p.streams.gone(ctx, d.Target):
			errs[i] = fmt.Errorf("publish to %s: the stream that captures it did not answer in time (stored or refused is unknown)",
				d.Target)
		case unheard[i]:
			p.streams.unanswered(d.Target)
		}
	}
}

// Connected reports whether NATS is connected, its path not silent, and
// the publisher proven to receive the answers to its deliveries on this
// connection (see inboxCheck).
func (p *Publisher) Connected() bool {
	return p.nc.IsConnected() && p.whySilent() == nil && p.inbox.verified(p.nc)
}

// msgID is the JetStream deduplication id of a delivery: the same for every
// redelivery of one envelope version's due time.
func msgID(d envelope.Delivery) string {
	return d.ID + "@" + strconv.FormatInt(d.Due.UnixMilli(), 10)
}

// Size is what NATS counts against max_payload for the delivery of
// e under id: the payload and every header, delayd's at their longest. It
// runs for every schedule request, so it adds up what deliveryMsg and the
// JetStream client would write (nats.go's header encoding: "NATS/1.0\r\n",
// "key: value\r\n" per value, "\r\n") instead of building the message.
func Size(e envelope.Envelope, id string, jetStream bool) int {
	line := func(k, v string) int { return len(k) + len(textproto.TrimString(v)) + len(": \r\n") }
	n := len("NATS/1.0\r\n\r\n") + len(e.Payload)
	for k, vs := range e.Header {
		if k == envelope.HeaderID || k == envelope.HeaderDue || k == envelope.HeaderAttempt ||
			k == envelope.HeaderOccurrence || (jetStream && k == jetstream.MsgIDHeader) {
			continue // replaced by delayd's own
		}
		for _, v := range vs {
			n += line(k, v)
		}
	}
	n += line(envelope.HeaderID, id) + longestDelivery.due + longestDelivery.attempt
	if e.Series != nil {
		n += longestDelivery.occurrence
	}
	if jetStream {
		// msgID(id, the longest due): "<id>@<ms>", trimmed like any value
		// (only its start can be space: it ends in digits).
		n += len(jetstream.MsgIDHeader) + len(": \r\n") + len(strings.TrimLeft(id, " \t\r\n")) + 1 + longestDelivery.ms
	}
	return n
}

// longestDelivery holds the lengths of delayd's delivery headers at their
// longest, worked out once: Size runs for every request.
var longestDelivery = func() (l struct{ due, attempt, occurrence, ms int }) {
	line := func(k, v string) int { return len(k) + len(v) + len(": \r\n") }
	due := envelope.MaxDue.Add(-time.Millisecond).UnixMilli()
	l.due = line(envelope.HeaderDue, envelope.FormatMs(due))
	l.attempt = line(envelope.HeaderAttempt, strconv.Itoa(longestAttempt))
	l.occurrence = line(envelope.HeaderOccurrence, strconv.Itoa(longestOccurrence))
	l.ms = len(strconv.FormatInt(due, 10))
	return l
}()

// longestAttempt stands in for the longest Delayd-Attempt a delivery carries.
const longestAttempt = 999999

// longestOccurrence is the largest occurrence number the store keeps (4
// bytes in the value header).
const longestOccurrence = 1<<32 - 1

// deliveryMsg builds the delivered message: the payload unchanged, the
// publisher's headers minus the control ones (already removed at intake),
// plus the delivery headers. The headers are a copy: the JetStream client
// adds Nats-Msg-Id to the message it publishes, and that must not leak
// into the envelope (a dead letter is built from it).
func deliveryMsg(d envelope.Delivery) *nats.Msg {
	h := make(nats.Header, len(d.Header)+4)
	for k, v := range d.Header {
		h[k] = v
	}
	// delayd's values share one backing array: one allocation, not four.
	vals := [4]string{d.ID, envelope.FormatMs(d.Due.UnixMilli()), strconv.Itoa(d.Attempt)}
	h[envelope.HeaderID] = vals[0:1:1]
	h[envelope.HeaderDue] = vals[1:2:2]
	h[envelope.HeaderAttempt] = vals[2:3:3]
	if d.Occurrence > 0 {
		vals[3] = strconv.FormatInt(d.Occurrence, 10)
		h[envelope.HeaderOccurrence] = vals[3:4:4]
	}
	return &nats.Msg{Subject: d.Target, Data: d.Payload, Header: h}
}
