package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// MaxLinger bounds how long a batched Schedule call waits for company.
const MaxLinger = time.Millisecond

// batchesInFlight is how many batch requests one client keeps in flight:
// while all are out, calls queue up and the next batch grows.
const batchesInFlight = 4

// Batching makes Schedule (and each attempt of ScheduleRetrying) gather
// concurrent calls into batch requests: up to size envelopes (default
// 100 when size < 1; keep it within the daemon's intake.max_batch, 1000 by
// default), and within the NATS server's max_payload both in bytes and in
// the most bytes the daemon's reply could take (docs/protocol.md, Batches).
// Two calls of one ID never share a batch. A free batch waits
// at most linger (0 to MaxLinger) for more calls; while every one of the
// client's 4 batches in flight is out, calls queue and the next batch
// takes them all. Each caller gets its own result and error, as without
// batching: a batch refused whole as too large (413, nothing stored) is
// sent again in halves, and a call alone as a plain request; a batch
// refused whole otherwise refuses each of its calls. Close stops the
// batching: call it also on a client made by New.
//
// Batching pays where many goroutines schedule at once: one NATS message
// and one reply for many envelopes. A single caller's Schedule gains
// nothing, and waits up to linger more.
func Batching(size int, linger time.Duration) Option {
	return func(c *Client) {
		if size < 1 {
			size = 100
		}
		linger = min(max(linger, 0), MaxLinger)
		c.batch = &batcher{c: c, size: size, linger: linger, queue: make(chan *batchedCall, 4*size),
			slots: make(chan struct{}, batchesInFlight), stop: make(chan struct{})}
	}
}

// batcher gathers Schedule calls into batch requests.
type batcher struct {
	c      *Client
	size   int
	linger time.Duration
	queue  chan *batchedCall
	slots  chan struct{} // batch requests in flight
	stop   chan struct{}
	start  sync.Once
	close  sync.Once
	wg     sync.WaitGroup
}

// The states of a batched call: queued, taken into a batch being sent, or
// given up by its caller before that (its context ended).
const (
	callQueued int32 = iota
	callSent
	callAbandoned
)

type batchedCall struct {
	msg   *nats.Msg // the request it is alone
	entry []byte    // its JSON, encoded by the caller's goroutine
	id    string
	worst int // the most bytes of the batch's reply its result can take
	state atomic.Int32
	done  chan BatchResult // buffered: the batch never waits for the caller
}

// schedule is Schedule through the batcher.
func (b *batcher) schedule(ctx context.Context, id string, m *nats.Msg) (Scheduled, error) {
	b.start.Do(func() { b.wg.Add(1); go b.run() })
	if err := ctx.Err(); err != nil {
		return Scheduled{}, fmt.Errorf("delayd schedule: not sent: %w: %w", ErrUnavailable, err)
	}
	call := &batchedCall{msg: m, entry: appendEntry(nil, m), id: id, worst: worstResult(id), done: make(chan BatchResult, 1)}
	select {
	case b.queue <- call:
	case <-b.stop:
		return Scheduled{}, fmt.Errorf("delayd schedule: not sent: %w: %w", ErrUnavailable, errClosed)
	case <-ctx.Done():
		return Scheduled{}, fmt.Errorf("delayd schedule: not sent: %w: %w", ErrUnavailable, ctx.Err())
	}
	select {
	case r := <-call.done:
		return r.Scheduled, r.Err
	case <-b.stop:
		if call.state.CompareAndSwap(callQueued, callAbandoned) {
			return Scheduled{}, fmt.Errorf("delayd schedule: not sent: %w: %w", ErrUnavailable, errClosed)
		}
		// Sent: its batch answers it before Close returns.
		r := <-call.done
		return r.Scheduled, r.Err
	case <-ctx.Done():
		if call.state.CompareAndSwap(callQueued, callAbandoned) {
			return Scheduled{}, fmt.Errorf("delayd schedule: not sent: %w: %w", ErrUnavailable, ctx.Err())
		}
		// In a batch on its way: the daemon may store it.
		return Scheduled{}, &unknownOutcome{verb: "schedule", id: id, err: ctx.Err()}
	}
}

// run gathers batches until Close: a free slot takes the first call
// queued, what is queued behind it, and what comes within linger.
func (b *batcher) run() {
	defer b.wg.Done()
	limit := int(b.c.nc.MaxPayload())
	var carry *batchedCall // did not fit the last batch
	for {
		select {
		case b.slots <- struct{}{}:
		case <-b.stop:
			b.drain(carry)
			return
		}
		first := carry
		carry = nil
		if first == nil {
			select {
			case first = <-b.queue:
			case <-b.stop:
				<-b.slots
				b.drain(nil)
				return
			}
		}
		batch := []*batchedCall{first}
		size := len(first.entry)
		reply := len(`{"results":[]}`) + first.worst
		ids := map[string]bool{first.id: true}
		var wait <-chan time.Time
		var timer *time.Timer
		if b.linger > 0 {
			timer = time.NewTimer(b.linger)
			wait = timer.C
		}
	gather:
		for len(batch) < b.size {
			var next *batchedCall
			select {
			case next = <-b.queue:
			default:
				if wait == nil {
					break gather
				}
				select {
				case next = <-b.queue:
				case <-wait:
					break gather
				}
			}
			// The request keeps 1 kB for its headers. Two envelopes of
			// one id in a batch: the daemon refuses the second.
			if limit > 0 && (size+len(next.entry)+1 > limit-1024 || reply+next.worst+1 > limit) ||
				next.id != "" && ids[next.id] {
				carry = next
				break
			}
			batch = append(batch, next)
			size += len(next.entry) + 1
			reply += next.worst + 1
			ids[next.id] = true
		}
		if timer != nil {
			timer.Stop()
		}
		b.wg.Add(1)
		go func(batch []*batchedCall) {
			defer b.wg.Done()
			defer func() { <-b.slots }()
			b.send(batch)
		}(batch)
	}
}

// send sends the calls still wanted as one batch and answers each.
func (b *batcher) send(batch []*batchedCall) {
	calls := batch[:0]
	for _, call := range batch {
		if call.state.CompareAndSwap(callQueued, callSent) {
			calls = append(calls, call)
		}
	}
	if len(calls) > 0 {
		b.sendCalls(calls)
	}
}

// sendCalls sends calls as one batch and answers each. A batch refused
// whole as too large stored nothing (over intake.max_batch, a reply that
// could outgrow max_payload, or a request over it: a payload grows by a
// third in base64): its halves are sent, down to a call alone, which goes
// as the plain request it is without batching.
func (b *batcher) sendCalls(calls []*batchedCall) {
	ctx, cancel := context.WithTimeout(context.Background(), b.c.retryTimeout)
	defer cancel()
	entries := make([][]byte, len(calls))
	for i, call := range calls {
		entries[i] = call.entry
	}
	results, err := b.c.sendBatch(ctx, entries, "")
	if errors.Is(err, ErrTooLarge) {
		cancel()
		if len(calls) == 1 {
			ctx, cancel := context.WithTimeout(context.Background(), b.c.retryTimeout)
			defer cancel()
			var out Scheduled
			err := b.c.request(ctx, "schedule", calls[0].id, calls[0].msg, &out)
			calls[0].done <- BatchResult{Scheduled: out, Err: err}
			return
		}
		b.sendCalls(calls[:len(calls)/2])
		b.sendCalls(calls[len(calls)/2:])
		return
	}
	for i, call := range calls {
		if err != nil {
			callErr := err
			if uo, ok := err.(*unknownOutcome); ok {
				// Named by the caller's id, to resend with.
				callErr = &unknownOutcome{verb: "schedule", id: call.id, err: uo.err}
			}
			call.done <- BatchResult{Err: callErr}
			continue
		}
		call.done <- results[i]
	}
}

// worstResult is the most bytes the daemon's reply to a batch can take
// for one envelope of this id, an id it makes being a 22-byte NUID: 170
// plus twice the id as JSON writes it (docs/protocol.md, Batches, Limits;
// the daemon refuses a batch whole if their sum could exceed max_payload).
func worstResult(id string) int {
	n := len(id)
	if id == "" {
		n = 22
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(id)
			n = len(b) - 2
			break
		}
	}
	return 170 + 2*n
}

// drain answers the calls left queued when the client closes.
func (b *batcher) drain(carry *batchedCall) {
	fail := func(call *batchedCall) {
		if call.state.CompareAndSwap(callQueued, callAbandoned) {
			call.done <- BatchResult{Err: fmt.Errorf("delayd schedule: not sent: %w: %w", ErrUnavailable, errClosed)}
		}
	}
	if carry != nil {
		fail(carry)
	}
	for {
		select {
		case call := <-b.queue:
			fail(call)
		default:
			return
		}
	}
}

// shutdown stops the batcher and waits for the batches in flight.
func (b *batcher) shutdown() {
	b.close.Do(func() { close(b.stop) })
	b.wg.Wait()
	b.drain(nil)
}
