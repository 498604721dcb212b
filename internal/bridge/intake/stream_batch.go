package intake

// Batch messages on the durable intake: one stream message with
// Delayd-Batch holds many envelopes (envelope.ParseBatch). Each envelope
// is checked on its own: a refused one goes to <prefix>.rejected alone,
// the valid ones join the same pipelines as single messages. The stream
// message is settled once, when its last envelope is: acknowledged when
// every valid one is stored, offered again when any was not. On the
// redelivery the envelopes stored already are recognised by their place in
// the message (sequence.index@time, as a single message by its sequence)
// and acknowledged without a second write.

import (
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// streamGroup is one batch message's envelopes on their way to Redis.
type streamGroup struct {
	msg    jetstream.Msg
	left   atomic.Int64
	failed atomic.Bool // an envelope was not stored: offer the message again
	bytes  int64       // held until settled
}

// handleBatch takes a batch message: rejected whole when the batch itself
// is malformed or over intake.max_batch, else envelope by envelope.
func (s *StreamIntake) handleBatch(m jetstream.Msg, h nats.Header, meta *jetstream.MsgMetadata, metaErr error, accepted time.Time) {
	if metaErr != nil {
		// Not a JetStream message: cannot happen on a pull consumer.
		s.log.Error("stream message without metadata", "error", metaErr)
		_ = m.Term()
		return
	}
	entries, err := envelope.ParseBatch(h, m.Data(), s.opt.MaxBatch)
	if err != nil {
		s.reject(m, err)
		return
	}
	prefix, _ := s.idPrefix.Load().(string)
	seq := strconv.FormatUint(meta.Sequence.Stream, 10)
	at := "@" + strconv.FormatInt(meta.Timestamp.UnixNano(), 10)
	g := &streamGroup{msg: m}
	items := make([]streamItem, 0, len(entries))
	ids := make(map[string]struct{}, len(entries))
	for i, e := range entries {
		idx := strconv.Itoa(i)
		err := e.Err
		var it store.Item
		if err == nil {
			// Without a Delayd-Id: named by the message and the place in
			// it, the same on every redelivery.
			it, err = s.check.itemAt(e.Header, e.Payload, func() (string, error) { return prefix + seq + "-" + idx, nil }, accepted)
		}
		if err == nil {
			if _, dup := ids[it.ID]; dup {
				err = &envelope.Error{Code: envelope.CodeBadRequest, Msg: "Delayd-Id " + it.ID + " appears earlier in this batch"}
			}
			ids[it.ID] = struct{}{}
		}
		if err != nil {
			s.rejectEntry(m, i, e, err)
			continue
		}
		it.StreamMsg = seq + "." + idx + at
		items = append(items, streamItem{msg: m, item: it, group: g})
	}
	if len(items) == 0 {
		// Every envelope refused (each copy is on <prefix>.rejected).
		if err := m.Term(); err != nil {
			s.log.Warn("terminating a rejected batch failed", "error", err)
		}
		s.settled.Store(true)
		return
	}
	if !s.gate.enter() {
		_ = m.NakWithDelay(s.opt.RetryDelay)
		return
	}
	defer s.gate.leave()
	g.bytes = requestBytes(m.Data(), m.Headers())
	s.held.acquire(g.bytes)
	// Counted before the first is queued: a flusher may settle it at once.
	g.left.Store(int64(len(items)))
	for _, it := range items {
		s.queue <- it
	}
}

// rejectEntry publishes envelope i of a batch message, its headers and
// payload plus Delayd-Error and Delayd-Error-Code, to <prefix>.rejected.
// Should the message be offered again (another envelope of it was not
// stored), the copy is published again.
func (s *StreamIntake) rejectEntry(m jetstream.Msg, i int, e envelope.BatchEntry, err error) {
	code := envelope.CodeOf(err)
	s.count(resultOfCode(code), 1)
	s.publishRejected(e.Header, e.Payload, "envelope "+strconv.Itoa(i)+" of a batch: "+err.Error(), code)
	s.log.Warn("rejected an envelope of a stream batch", "code", code, "error", err, "index", i, "subject", m.Subject())
}

// settleGrouped records a batched envelope's outcome (and counts it like
// flush counts a single message's); the last of its message acks it, or
// offers it again if any envelope was not stored.
func (s *StreamIntake) settleGrouped(b streamItem, r store.Scheduled, err error, stored, failed, again int) (int, int, int) {
	g := b.group
	switch {
	case err != nil:
		if errors.Is(err, store.ErrNotReplicated) && r.Kind == store.Stored {
			// Written but not confirmed by the replicas: due on the master.
			s.waker.Wake(s.store.Shard(b.item.ID), r.DueMs)
		}
		g.failed.Store(true)
		failed++
	case r.Kind != store.Stored:
		again++
		stored++
	default:
		s.waker.Wake(s.store.Shard(b.item.ID), r.DueMs)
		stored++
	}
	if g.left.Add(-1) != 0 {
		return stored, failed, again
	}
	s.held.release(g.bytes)
	if g.failed.Load() {
		if err := g.msg.NakWithDelay(s.opt.RetryDelay); err != nil {
			s.log.Debug("nak failed; the message is offered again after ack_wait", "error", err)
		}
		return stored, failed, again
	}
	if err := g.msg.Ack(); err != nil {
		s.log.Debug("ack failed", "error", err)
	}
	s.settled.Store(true)
	return stored, failed, again
}
