package intake

// The stream intake's message path: each pulled message is parsed and
// validated, batched, stored, and acked (or rejected, or offered again).

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// handle validates one message as the request intake validates a schedule
// request; a valid one is queued for Redis, an invalid one terminated and
// published to <prefix>.rejected.
func (s *StreamIntake) handle(m jetstream.Msg) {
	if isParkSubject(s.opt.Subject, m.Subject()) {
		// A migration's barrier (stream_migrate.go): no envelope; settled
		// so the drain can pass it.
		if err := m.Ack(); err != nil {
			s.log.Debug("ack of a migration's barrier failed; it comes again", "error", err)
		}
		s.settled.Store(true)
		return
	}
	// Parsed once: the message's sequence and the time the stream took it.
	meta, metaErr := m.Metadata()
	accepted := s.opt.Now()
	if metaErr == nil && !meta.Timestamp.IsZero() {
		accepted = meta.Timestamp
	}
	h := intakeHeaders(m.Headers())
	if _, ok := envelope.IsBatch(h); ok {
		s.handleBatch(m, h, meta, metaErr, accepted)
		return
	}
	it, err := s.check.itemAt(h, m.Data(), func() (string, error) {
		if metaErr != nil {
			return "", metaErr
		}
		prefix, _ := s.idPrefix.Load().(string)
		return prefix + strconv.FormatUint(meta.Sequence.Stream, 10), nil
	}, accepted)
	var rejection *envelope.Error
	switch {
	case errors.As(err, &rejection):
		s.reject(m, err)
		return
	case err != nil:
		// Not a JetStream message: cannot happen on a pull consumer.
		s.log.Error("stream message without metadata", "error", err)
		_ = m.Term()
		return
	}
	// The message's identity in the stream (its sequence, and its time in
	// case the stream was made anew): a redelivery of a message whose ack
	// was lost is then acked, not stored again.
	if metaErr == nil {
		it.StreamMsg = strconv.FormatUint(meta.Sequence.Stream, 10) + "@" + strconv.FormatInt(meta.Timestamp.UnixNano(), 10)
	}
	g := &streamMsg{s: s, msg: m}
	s.takeMsg(g, item{Item: it, to: g})
}

// takeMsg queues the envelopes of g's message. It waits while the messages
// taken and not yet settled hold PullBytes: a burst of large payloads then
// waits in the stream, not in memory.
func (s *StreamIntake) takeMsg(g *streamMsg, items ...item) {
	if !s.take(&g.group, requestBytes(g.msg.Data(), g.msg.Headers()), items...) {
		// Stopping: the stream offers it again (to any daemon).
		_ = g.msg.NakWithDelay(s.opt.RetryDelay)
	}
}

// intakeHeaders drops the headers that were addressed to the intake
// stream itself (deduplication and expectations of the publish into it)
// and those nats-server stamped on the way in (stampedHeaders), so they
// are neither refused as Nats-* nor passed on to the target.
func intakeHeaders(h nats.Header) nats.Header {
	drop := false
	for k := range h {
		if isIntakeHeader(k) {
			drop = true
			break
		}
	}
	if !drop {
		return h
	}
	out := make(nats.Header, len(h))
	for k, v := range h {
		if !isIntakeHeader(k) {
			out[k] = v
		}
	}
	return out
}

func isIntakeHeader(k string) bool {
	return strings.EqualFold(k, jetstream.MsgIDHeader) || envelope.HasPrefixFold(k, "Nats-Expected-") || isStampedHeader(k)
}

// reject publishes the message, headers and payload unchanged plus
// Delayd-Error, to <prefix>.rejected and terminates it in the stream.
func (s *StreamIntake) reject(m jetstream.Msg, err error) {
	code := envelope.CodeOf(err)
	// Counted first: whoever sees the copy on <prefix>.rejected sees the
	// count too.
	s.count(resultOfCode(code), 1)
	s.publishRejected(m.Headers(), m.Data(), err.Error(), code)
	// Plain Term: nats-server before 2.11 does not know "+TERM <reason>"
	// and would redeliver the message for ever. The reason is on the
	// rejected copy and in the log.
	if terr := m.Term(); terr != nil {
		s.log.Warn("terminating a rejected envelope failed", "error", terr)
	}
	s.settled.Store(true)
	s.log.Warn("rejected a stream envelope", "code", code, "error", err, "subject", m.Subject())
}

// headerErrorCode carries the protocol code (400, 403, 413) of a rejected
// stream envelope, next to Delayd-Error.
const headerErrorCode = "Delayd-Error-Code"

// setRejection sets Delayd-Error and Delayd-Error-Code on a rejected copy,
// deleting first every spelling of them the publisher sent: NATS headers
// keep their case, so a forged "delayd-error-code: 200" would otherwise
// ride along next to delayd's own.
// headerRejectedBytes, on a rejected copy without its payload, is how many
// bytes the payload had.
const headerRejectedBytes = "Delayd-Rejected-Bytes"

// publishRejected publishes a refused envelope's copy to <prefix>.rejected:
// its headers and payload with Delayd-Error and Delayd-Error-Code. A copy
// NATS cannot take as it is (its payload near max_payload leaves no room
// for the error headers; a header name NATS cannot encode) goes as the
// error, the code and the payload's size alone: the envelope is refused
// and terminated either way, and must not vanish into a log line.
func (s *StreamIntake) publishRejected(src map[string][]string, data []byte, msg string, code int) {
	h := make(nats.Header, len(src)+2)
	for k, v := range src {
		// The copy goes out with delayd's rights: no Nats-* header of the
		// publisher's (a forged dedup id, a TTL, an expectation) rides along.
		if !envelope.IsNATSHeader(k) {
			h[k] = v
		}
	}
	setRejection(h, msg, code)
	subject := rejectedSubject(s.opt.Subject)
	perr := s.nc.PublishMsg(&nats.Msg{Subject: subject, Header: h, Data: data})
	if perr == nil {
		return
	}
	bare := nats.Header{}
	setRejection(bare, msg+"; the copy's headers and payload were dropped: "+perr.Error(), code)
	bare.Set(headerRejectedBytes, strconv.Itoa(len(data)))
	if err := s.nc.PublishMsg(&nats.Msg{Subject: subject, Header: bare}); err != nil {
		s.log.Warn("publishing a rejected envelope failed", "error", err, "first_error", perr)
		return
	}
	s.log.Warn("published a rejected envelope without its headers and payload", "error", perr, "payload_bytes", len(data))
}

func setRejection(h nats.Header, msg string, code int) {
	for k := range h {
		if strings.EqualFold(k, envelope.HeaderError) || strings.EqualFold(k, headerErrorCode) {
			delete(h, k)
		}
	}
	h[envelope.HeaderError] = []string{msg}
	h[headerErrorCode] = []string{strconv.Itoa(code)}
}

func resultOfCode(code int) string {
	switch code {
	case envelope.CodeForbidden:
		return "forbidden"
	case envelope.CodeTooLarge:
		return "too_large"
	}
	return "bad_request"
}

// streamMsg is a stream message on its way, alone or a batch: acked once
// Redis confirmed every envelope, else offered again after RetryDelay (an
// outcome unknown too: the same id on redelivery replaces what was stored).
type streamMsg struct {
	group
	s      *StreamIntake
	msg    jetstream.Msg
	failed atomic.Bool // an envelope was not stored: offer the message again
}

func (m *streamMsg) settle(it *item) {
	if it.out.err != nil {
		m.failed.Store(true)
	}
	if !m.done(m.s.held) {
		return
	}
	if m.failed.Load() {
		if err := m.msg.NakWithDelay(m.s.opt.RetryDelay); err != nil {
			m.s.log.Debug("nak failed; the message is offered again after ack_wait", "error", err)
		}
		return
	}
	if err := m.msg.Ack(); err != nil {
		// Stored; the stream offers it again after ack_wait and the same
		// id replaces it.
		m.s.log.Debug("ack failed", "error", err)
	}
	m.s.settled.Store(true)
}

// countFlush counts a flush's envelopes by outcome and logs its failures.
func (s *StreamIntake) countFlush(batch []item) {
	stored, failed, again := 0, 0, 0
	var firstErr error
	for i := range batch {
		o := batch[i].out
		switch {
		case o.err != nil:
			failed++
			if firstErr == nil {
				firstErr = o.err
			}
		case o.Kind != store.Stored:
			// Stored by an earlier delivery whose ack was lost, or a resend
			// of a request delivered already.
			again++
		default:
			stored++
		}
	}
	if failed > 0 {
		s.log.Error("storing stream envelopes failed; they stay in the stream", "count", failed, "error", firstErr)
		s.obs.RedisError(store.OpSchedule)
		s.count("unavailable", failed)
	}
	if again > 0 {
		s.log.Debug("stream redeliveries of messages stored already were acked, not stored again", "count", again)
		s.count("redelivered", again)
	}
	if stored > 0 {
		s.count("stored", stored)
	}
}

func (s *StreamIntake) count(result string, n int) {
	s.obs.StreamIntake(result, n)
}
