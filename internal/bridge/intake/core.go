package intake

// The core both intakes share, from a handler's item to its settler's
// answer: one flush, one outcome per item, one group per batch message.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// scheduler is what the core needs of either intake's store.
type scheduler interface {
	Schedule(ctx context.Context, items []store.Item) ([]store.Scheduled, []error)
	Shard(id string) int
}

// item is one envelope on its way through the pipelines.
type item struct {
	store.Item
	to    settler
	reply string    // a single request's reply subject
	idx   int       // its place in its batch
	start time.Time // when its request was taken (the request intake)
	bytes int64     // a single request's; a group holds its envelopes'
	out   outcome   // set by its flush
}

// outcome is what became of one item, decided once from Schedule's answer.
type outcome struct {
	store.Scheduled
	// err is why it was not stored: nil when it was or was answered
	// without a write (StoredBefore, Resend), errStale when never tried.
	err error
}

// errStale: the request waited longer than the store timeout (staleMsg).
var errStale = fmt.Errorf("%w: waited too long for Redis", store.ErrNotWritten)

// due reports whether the envelope now waits in Redis, so its shard's
// scanner is woken for it: stored, or written on the master but not
// confirmed by the replicas (it falls due there; a failover may lose it).
func (o outcome) due() bool {
	return o.Kind == store.Stored && (o.err == nil || errors.Is(o.err, store.ErrNotReplicated))
}

// settler answers for the message an item came in: a single request
// (singleReply), a batch request (*batchReply), a stream message alone or
// in a batch (*streamMsg).
type settler interface {
	// settle answers for it, once every outcome of its flush is counted.
	settle(it *item)
	// settled lets go of what it held, once its flush answered every item.
	settled(it *item)
}

// group is the envelopes of one message, a batch request or a stream
// message (alone or a batch): each settles its share, and the last one
// lets go of the message's bytes and answers it.
type group struct {
	left  atomic.Int64
	bytes int64
}

// done counts one envelope settled and reports whether it was the last;
// the count orders every envelope's share before the last one's read.
func (g *group) done(held *heldBytes) bool {
	if g.left.Add(-1) != 0 {
		return false
	}
	held.release(g.bytes)
	return true
}

// settled: an envelope holds nothing of its own.
func (*group) settled(*item) {}

// core is what both intakes share: the queue, the bytes held, the flush.
type core[S scheduler] struct {
	store S
	waker Waker
	log   hclog.Logger
	check validator
	queue chan item
	held  *heldBytes // taken and not yet answered
	gate  sendGate   // handlers' sends to queue, until Run closes it
	// timeout bounds one Schedule call (storeTimeout); an item that waited
	// longer than maxWait (set by the request intake) is not written.
	timeout, maxWait time.Duration
	now              func() time.Time
	// tally counts and logs a flush's outcomes, before any is answered.
	tally func(batch []item)
	trace func(id, stage string, at time.Time) // IntakeOptions.trace
}

// take queues a message's items, holding its bytes (waiting while the
// intake is at its bound) until they are answered, by g if it has one. It
// reports false, and queues nothing, once Run has closed the queue.
func (c *core[S]) take(g *group, bytes int64, items ...item) bool {
	if !c.gate.enter() {
		return false
	}
	defer c.gate.leave()
	c.held.acquire(bytes)
	c.traceAll(items, "queued")
	if g != nil {
		// Before the first is queued: a flusher may settle it at once.
		g.left.Store(int64(len(items)))
		g.bytes = bytes
	}
	for _, it := range items {
		c.queue <- it
	}
	return true
}

// batchItems checks a batch's envelopes one by one: a valid one (check
// makes it) becomes an item answered by to, an invalid one is refused.
func batchItems(entries []envelope.BatchEntry, to settler, start time.Time,
	check func(i int, e envelope.BatchEntry) (store.Item, error), refuse func(i int, e envelope.BatchEntry, err error)) []item {
	items := make([]item, 0, len(entries))
	ids := make(map[string]struct{}, len(entries))
	for i, e := range entries {
		err := e.Err
		var it store.Item
		if err == nil {
			it, err = check(i, e)
		}
		if err == nil {
			// Two envelopes of one id in one batch could reach Redis in
			// either order (two flushers): the second is refused.
			if _, dup := ids[it.ID]; dup {
				err = &envelope.Error{Code: envelope.CodeBadRequest, Msg: "Delayd-Id " + it.ID + " appears earlier in this batch"}
			}
			ids[it.ID] = struct{}{}
		}
		if err != nil {
			refuse(i, e, err)
			continue
		}
		items = append(items, item{Item: it, to: to, idx: i, start: start})
	}
	return items
}

// traceAll tells trace that every item reached stage.
func (c *core[S]) traceAll(items []item, stage string) {
	if c.trace == nil {
		return
	}
	at := time.Now()
	for i := range items {
		c.trace(items[i].ID, stage, at)
	}
}

// flush stores one batch in one pipeline and answers for every item.
func (c *core[S]) flush(batch []item) {
	if c.maxWait > 0 {
		// A request that waited longer than the store timeout (Redis
		// stalled and every pipeline was busy) is dropped unwritten with
		// 503: its client has likely given up and may already have retried
		// or cancelled, and a late write would overtake that.
		fresh := batch[:0]
		for i := range batch {
			if c.now().Sub(batch[i].start) > c.maxWait {
				batch[i].out = outcome{err: errStale}
				c.settle(batch[i : i+1])
				continue
			}
			fresh = append(fresh, batch[i])
		}
		if batch = fresh; len(batch) == 0 {
			return
		}
	}
	items := make([]store.Item, len(batch))
	for i := range batch {
		items[i] = batch[i].Item
	}
	c.traceAll(batch, "flush")
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	res, errs := c.store.Schedule(ctx, items)
	cancel()
	c.traceAll(batch, "stored")
	for i := range batch {
		batch[i].out = outcome{res[i], errs[i]}
	}
	c.settle(batch)
}

// settle wakes and counts every outcome, answers every item, then lets go
// of what they held. Every outcome is woken and counted before its
// answer goes out, so a client holding its reply finds the metric and the
// scanner's plan already there. The answers then go out back to back:
// nats.go's flusher writes whatever is buffered when it wakes, so a tight
// run of publishes leaves in one or two writes instead of one per reply
// (each write is a read, a parse and a flush in nats-server too: the
// latency budget's CPU split); the bookkeeping comes after.
func (c *core[S]) settle(batch []item) {
	for i := range batch {
		if o := batch[i].out; o.due() {
			c.waker.Wake(c.store.Shard(batch[i].ID), o.DueMs)
		}
	}
	c.tally(batch)
	for i := range batch {
		batch[i].to.settle(&batch[i])
	}
	for i := range batch {
		batch[i].to.settled(&batch[i])
	}
}
