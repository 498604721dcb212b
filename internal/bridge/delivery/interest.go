package delivery

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/scanner"
)

// interest confirms core deliveries by what answers them. Each is
// published with a reply subject on delayd's inbox,
//
//	<inbox>.<batch token>.<index>.<key>
//
// where the batch token (72 random bits) is new for every batch and the
// key (48 random bits) for every delivery, so a consumer that sees the
// reply subjects of its own deliveries can guess neither another batch's
// nor another delivery's. An answer counts only on the exact subject of a
// delivery whose batch still waits for it; anything else is dropped.
//
// What may answer (see classify): the server's no-responders status when
// no subscription matched (the connection announces headers and
// no_responders, as nats.go does by default); a JetStream stream that
// captures the subject, with its PubAck or its error (a full stream, a
// sealed one, a message too large...); a subscriber's own reply.
//
// The server writes a no-responders status before the PONG of the flush
// that follows the batch, and nats.go's read loop hands it to the
// subscription's channel before it reads the PONG, so once the flush
// returns, every status of the batch is in the channel, counted by the
// subscription's Delivered: a batch waits until as many were taken off
// (flushed). A stream answers from its own goroutine, after the PONG as
// often as not: a batch waits for the answers of the deliveries to targets
// a stream is known to capture (await), until its deadline.
type interest struct {
	ch       chan *nats.Msg
	base     string // "<inbox>."
	done     chan struct{}
	refusals *bridge.Refusals
	// heard is told, outside the lock, of every stream answer: the target
	// of a delivery of a waiting batch, or of one that ended lately (late
	// set: the delivery was counted already), or "" for an answer that
	// cannot be placed (too old, or forged).
	heard func(target string, a verdict, reason, stream string, late bool)

	mu    sync.Mutex
	sub   *nats.Subscription
	taken int64 // messages of sub taken off ch
	// waiting: the batches whose flush returned, each until taken reaches
	// what sub had delivered by then (flushed). Flushes overlap.
	waiting []waiter
	batches map[string]*batch // by token, until finished
	// ended keeps the batches finished lately (by token, and in the order
	// they ended), so that a stream's late answer still names its target.
	ended      map[string]*batch
	endedOrder []string
	endedSize  int // deliveries of the ended batches kept
	// The inbox self-check in flight: its subject, closed when it came.
	probe  string
	probed chan struct{}
	// subscribed is the refusals' mark when sub was made: the server's
	// refusal of it comes after.
	subscribed uint64
}

// verdict is what a delivery's reply subject heard.
type verdict uint8

const (
	unanswered   verdict = iota
	replied              // a subscriber's reply: it reached someone
	noResponders         // the server: no subscription matched
	stored               // a stream's PubAck
	refused              // a stream's error: not stored
)

// batch is one Publish call's deliveries, as the interest check sees them.
type batch struct {
	sub      *nats.Subscription // the answers' subscription when it began
	token    string
	replies  string // every reply subject, one after the other
	ends     []int  // reply i is replies[ends[i-1]:ends[i]]
	targets  []string
	verdicts []verdict
	reasons  []string // a refusal's text, by delivery
	await    []bool   // waits for a stream's answer
	pending  int      // awaited answers not in yet
	listed   []bool   // of those, to a target a listed stream captures
	listing  int      // listed answers not in yet
	// listedIn is closed when listing is 0: a listed stream's answer is
	// waited for longer (listedWindow) than the others.
	listedIn chan struct{}
	// probe: a delivery to a target no listed stream captures, whose
	// capture is unknown (a subject mapping of the account can route it
	// to a stream): it waits for a stream's answer up to a short grace.
	probe   []bool
	probing int           // probes not answered yet
	allIn   chan struct{} // closed when pending and probing are both 0
}

// statusBuffer is the channel between nats.go's read loop and the
// goroutine taking answers off it. An answer that finds it full is dropped
// by nats.go (slow consumer); Publish notices and fails the deliveries it
// cannot vouch for.
const statusBuffer = 1 << 16

func newInterest(nc *nats.Conn, refusals *bridge.Refusals, heard func(string, verdict, string, string, bool)) (*interest, error) {
	in := &interest{ch: make(chan *nats.Msg, statusBuffer), base: nc.NewInbox() + ".",
		done: make(chan struct{}), refusals: refusals, heard: heard, batches: map[string]*batch{}, ended: map[string]*batch{}}
	if err := in.subscribe(nc); err != nil {
		return nil, err
	}
	go in.run()
	return in, nil
}

// subscribe (again) to the answers: a subscription the server refused
// (no permission) is not known to it, and stays unknown when the
// permission is granted later, until the client subscribes again. The
// caller holds the publisher's send lock, so no batch is being written; a
// batch flushed before finds the subscription changed (flushed).
func (in *interest) subscribe(nc *nats.Conn) error {
	mark := in.refusals.Mark()
	sub, err := nc.ChanSubscribe(in.base+">", in.ch)
	if err != nil {
		return fmt.Errorf("bridge: subscribe to the delivery answers: %w", err)
	}
	in.mu.Lock()
	old := in.sub
	in.sub, in.taken, in.subscribed = sub, 0, mark
	for _, w := range in.waiting {
		close(w.woken) // their batches find the subscription changed
	}
	in.waiting = nil
	in.mu.Unlock()
	if old != nil {
		_ = old.Unsubscribe()
	}
	return nil
}

func (in *interest) run() {
	for {
		select {
		case <-in.done:
			return
		case m := <-in.ch:
			a, reason, stream := classify(m)
			in.mu.Lock()
			if m.Sub == in.sub {
				in.taken++
				in.wake()
			}
			target, placed, late := in.take(m.Subject, a, reason)
			in.mu.Unlock()
			if (a == stored || a == refused) && in.heard != nil {
				if !placed {
					target = ""
				}
				in.heard(target, a, reason, stream, late)
			}
		}
	}
}

// take records answer a on subject, if it is a reply subject of a
// waiting batch's delivery, and returns that delivery's target; for a
// batch that ended lately it returns the target with late set, and
// records nothing. Under mu.
func (in *interest) take(subject string, a verdict, reason string) (target string, ok, late bool) {
	rest, ok := strings.CutPrefix(subject, in.base)
	if !ok {
		return "", false, false
	}
	if in.probe != "" && subject == in.probe {
		close(in.probed)
		in.probe = ""
		return "", false, false
	}
	token, idx, ok := strings.Cut(rest, ".")
	b := in.batches[token]
	if b == nil {
		b, late = in.ended[token], true
	}
	if !ok || b == nil {
		return "", false, false
	}
	idx, _, ok = strings.Cut(idx, ".")
	n, err := strconv.ParseUint(idx, 36, 31)
	if !ok || err != nil || int(n) >= len(b.verdicts) {
		return "", false, false
	}
	i := int(n)
	if subtle.ConstantTimeCompare([]byte(subject), []byte(b.reply(i))) != 1 {
		return "", false, false // a guessed key
	}
	if late {
		return b.targets[i], true, true
	}
	// A refusal stands whatever else answered; a stream's answer outranks
	// a subscriber's reply; no responders is only ever alone.
	if a > b.verdicts[i] {
		b.verdicts[i] = a
		if a == refused {
			b.reasons[i] = reason
		}
	}
	if a == stored || a == refused {
		in.unawait(b, i)
	}
	return b.targets[i], true, false
}

// unawait stops waiting for delivery i's stream answer. Under mu.
func (in *interest) unawait(b *batch, i int) {
	switch {
	case b.await[i]:
		b.await[i] = false
		b.pending--
		if b.listed[i] {
			b.listed[i] = false
			if b.listing--; b.listing == 0 {
				close(b.listedIn)
			}
		}
	case b.probe[i]:
		b.probe[i] = false
		b.probing--
	default:
		return
	}
	if b.pending == 0 && b.probing == 0 {
		close(b.allIn)
	}
}

// classify reads what answered a delivery. A stream answers with JSON: a
// PubAck {"stream":"S","seq":N,...} or an error
// {"error":{"code":C,"err_code":E,"description":"..."},"stream":"S","seq":0}
// (nats-server's JSPubAckResponse; every refusal of a stream's ingest
// carries the stream's name). The no-responders status is an empty message
// with "Status: 503", as nats.go's request API recognises it. Anything else
// is a subscriber's reply, whatever it says.
func classify(m *nats.Msg) (a verdict, reason, stream string) {
	if len(m.Data) == 0 {
		if m.Header.Get("Status") == "503" {
			return noResponders, "", ""
		}
		return replied, "", ""
	}
	if m.Data[0] != '{' {
		return replied, "", ""
	}
	var r struct {
		Stream *string `json:"stream"`
		Seq    *uint64 `json:"seq"`
		Error  *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if json.Unmarshal(m.Data, &r) != nil || r.Stream == nil {
		return replied, "", ""
	}
	switch {
	case r.Error != nil:
		e := r.Error
		return refused, fmt.Sprintf("stream %s refused it: %s (code %d, err_code %d)", *r.Stream, e.Description, e.Code, e.ErrCode), *r.Stream
	case r.Seq != nil:
		return stored, "", *r.Stream
	}
	return replied, "", ""
}

// Reply subjects: base64url, whose characters are all valid in a subject
// token.
const (
	tokenBytes = 9 // 72 bits per batch
	keyBytes   = 6 // 48 bits per delivery
)

var enc = base64.RawURLEncoding

// begin registers a batch of ds, whose deliveries awaited (by index) wait
// for a stream's answer (await: until the deadline; probe: a short grace),
// and builds its reply subjects. The caller holds the publisher's send
// lock while it writes the batch.
func (in *interest) begin(ds []envelope.Delivery, awaited func(i int) wait) (b *batch, dropped int) {
	n := len(ds)
	random := make([]byte, tokenBytes+keyBytes*n)
	if _, err := rand.Read(random); err != nil {
		panic(err) // crypto/rand never fails (Go 1.24+)
	}
	b = &batch{token: enc.EncodeToString(random[:tokenBytes]), ends: make([]int, n), targets: make([]string, n),
		verdicts: make([]verdict, n), reasons: make([]string, n), await: make([]bool, n), listed: make([]bool, n),
		listedIn: make(chan struct{}), probe: make([]bool, n), allIn: make(chan struct{})}
	// Every reply subject of the batch is cut from one string: one
	// allocation per batch, not one per delivery.
	size := n * (len(in.base) + enc.EncodedLen(tokenBytes) + enc.EncodedLen(keyBytes) + 2 + 4)
	s := make([]byte, 0, size)
	for i, d := range ds {
		s = append(s, in.base...)
		s = append(s, b.token...)
		s = append(s, '.')
		s = strconv.AppendUint(s, uint64(i), 36)
		s = append(s, '.')
		s = enc.AppendEncode(s, random[tokenBytes+keyBytes*i:tokenBytes+keyBytes*(i+1)])
		b.ends[i] = len(s)
		b.targets[i] = d.Target
		switch awaited(i) {
		case waitListed:
			b.listed[i] = true
			b.listing++
			fallthrough
		case waitLearned:
			b.await[i] = true
			b.pending++
		case waitProbe:
			b.probe[i] = true
			b.probing++
		}
	}
	b.replies = string(s)
	if b.listing == 0 {
		close(b.listedIn)
	}
	if b.pending == 0 && b.probing == 0 {
		close(b.allIn)
	}
	in.mu.Lock()
	in.batches[b.token] = b
	b.sub = in.sub
	in.mu.Unlock()
	dropped, _ = b.sub.Dropped()
	return b, dropped
}

// reply is the reply subject of delivery i.
func (b *batch) reply(i int) string {
	start := 0
	if i > 0 {
		start = b.ends[i-1]
	}
	return b.replies[start:b.ends[i]]
}

// flushed waits, after batch b's flush returned, until every message
// delivered to the subscription by then is taken, so that every
// no-responders status of the batch is recorded. ok is false when that
// cannot be known: ctx ended first, nats.go dropped a message since
// begin, or the subscription was made again meanwhile.
func (in *interest) flushed(ctx context.Context, b *batch, dropped int) (ok bool) {
	delivered, err := b.sub.Delivered()
	ok = err == nil
	if ok {
		w := waiter{until: delivered, woken: make(chan struct{})}
		in.mu.Lock()
		if in.sub != b.sub || in.taken >= delivered {
			close(w.woken)
		} else {
			in.waiting = append(in.waiting, w)
		}
		in.mu.Unlock()
		select {
		case <-w.woken:
		case <-ctx.Done():
			ok = false
			in.mu.Lock()
			in.waiting = slices.DeleteFunc(in.waiting, func(o waiter) bool { return o.woken == w.woken })
			in.mu.Unlock()
		}
	}
	in.mu.Lock()
	if in.sub != b.sub {
		ok = false
	}
	in.mu.Unlock()
	if now, err := b.sub.Dropped(); err != nil || now != dropped {
		ok = false
	}
	return ok
}

// waiter is a batch waiting in flushed.
type waiter struct {
	until int64
	woken chan struct{}
}

// wake ends the waits that taken has reached. Under mu.
func (in *interest) wake() {
	in.waiting = slices.DeleteFunc(in.waiting, func(w waiter) bool {
		if in.taken < w.until {
			return false
		}
		close(w.woken)
		return true
	})
}

// unawaited stops waiting for the stream answers of the deliveries that
// failed already.
func (in *interest) unawaited(b *batch, failed []error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for i, err := range failed {
		if err != nil {
			in.unawait(b, i)
		}
	}
}

// settle waits until every stream answer the batch waits for is in, up
// to short, and those of listed streams up to long, or until ctx ends,
// then ends the batch: a later answer is only told to heard, as late. It
// returns what each delivery heard, which awaited answers never came, and
// which probes heard no stream.
func (in *interest) settle(ctx context.Context, b *batch, short, long time.Duration) (verdicts []verdict, reasons []string, missing, unheard []bool) {
	t := time.NewTimer(short)
	select {
	case <-b.allIn:
	case <-t.C:
		t.Reset(long - short)
		select {
		case <-b.listedIn:
		case <-t.C:
		case <-ctx.Done():
		}
	case <-ctx.Done():
	}
	t.Stop()
	in.mu.Lock()
	defer in.mu.Unlock()
	delete(in.batches, b.token)
	in.ended[b.token] = b
	in.endedOrder = append(in.endedOrder, b.token)
	in.endedSize += len(b.ends)
	for len(in.endedOrder) > 1 && (len(in.endedOrder) > endedKept || in.endedSize > endedKeptDeliveries) {
		in.endedSize -= len(in.ended[in.endedOrder[0]].ends)
		delete(in.ended, in.endedOrder[0])
		in.endedOrder = append(in.endedOrder[:0], in.endedOrder[1:]...)
	}
	return b.verdicts, b.reasons, b.await, b.probe
}

// endedKept is how many ended batches keep their targets for late
// answers, and endedKeptDeliveries how many deliveries they may hold in
// all (the newest is kept whatever its size): behind a backlog a publish
// merges thousands of deliveries into one batch, and 64 of those held
// tens of MB (a late answer a batch no longer kept names is only not
// attributed: the delivery's outcome was settled when its batch ended).
const (
	endedKept           = 64
	endedKeptDeliveries = 4096
)

// verdict reports what delivery i heard so far.
func (in *interest) verdict(b *batch, i int) verdict {
	in.mu.Lock()
	defer in.mu.Unlock()
	return b.verdicts[i]
}

func (in *interest) close() {
	close(in.done)
	in.mu.Lock()
	sub := in.sub
	in.mu.Unlock()
	_ = sub.Unsubscribe()
}

// errNoInterest is the error of a core delivery that reached no
// subscriber.
func errNoInterest(target string) error {
	return fmt.Errorf("publish to %s: %w (the server answered no responders)", target, scanner.ErrNoInterest)
}
