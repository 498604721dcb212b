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
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

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
	g := &streamMsg{s: s, msg: m}
	items := batchItems(entries, g, time.Time{}, func(i int, e envelope.BatchEntry) (store.Item, error) {
		// Without a Delayd-Id: named by the message and the place in it,
		// the same on every redelivery.
		idx := strconv.Itoa(i)
		it, err := s.check.itemAt(e.Header, e.Payload, func() (string, error) { return prefix + seq + "-" + idx, nil }, accepted)
		it.StreamMsg = seq + "." + idx + at
		return it, err
	}, func(i int, e envelope.BatchEntry, err error) { s.rejectEntry(m, i, e, err) })
	if len(items) == 0 {
		// Every envelope refused (each copy is on <prefix>.rejected).
		if err := m.Term(); err != nil {
			s.log.Warn("terminating a rejected batch failed", "error", err)
		}
		s.settled.Store(true)
		return
	}
	s.takeMsg(g, items...)
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
