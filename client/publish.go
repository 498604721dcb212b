package client

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Published is the stream's acknowledgement of a Publish.
type Published struct {
	// ID is the envelope's id: the ID option, or the one Publish made.
	ID string
	// Stream and Sequence say where the stream holds it until a daemon
	// has stored it in Redis.
	Stream   string
	Sequence uint64
}

// Publish hands payload to delayd through its durable intake: a JetStream
// publish to <prefix>.intake with the same headers as Schedule. It returns
// when the stream has acknowledged it, which means it is durable even
// while every delayd is down; a daemon stores it in Redis later.
//
// Unlike Schedule there is no answer from delayd: an envelope the daemon
// refuses (400, 403, 413) goes to <prefix>.rejected, not to the caller.
// Only the options are checked here (ErrBadRequest, nothing sent).
//
// Without an ID option Publish makes one (a NUID) and returns it, so the
// caller can cancel the envelope and a retried Publish replaces rather
// than duplicates. (The daemon would otherwise name it after the stream
// sequence, which the caller cannot know before the acknowledgement.) No
// Nats-Msg-Id is set: the stream's duplicate window would drop a
// deliberate replacement under the same id.
//
// Errors: ErrUnavailable when no stream captures the subject (no
// JetStream, or the daemon's stream intake is off); ErrOutcomeUnknown
// when ctx ends before the acknowledgement (publish again with the same
// ID).
func (c *Client) Publish(ctx context.Context, target string, payload []byte, opts ...ScheduleOption) (Published, error) {
	m, err := build(target, payload, opts)
	if err != nil {
		return Published{}, err
	}
	id := m.Header.Get(headerID)
	if id == "" {
		id = newID()
		m.Header.Set(headerID, id)
	}
	m.Subject = c.prefix + ".intake"
	js, err := jetstream.New(c.nc)
	if err != nil {
		return Published{}, fmt.Errorf("delayd publish: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Published{}, fmt.Errorf("delayd publish: not sent: %w", err)
	}
	ack, err := js.PublishMsg(ctx, m)
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders):
		return Published{}, fmt.Errorf("delayd publish: no stream captures %s: is the stream intake enabled (intake.stream.enabled) and JetStream on? (%w: %w)",
			m.Subject, ErrUnavailable, err)
	case notSent(err) != nil:
		return Published{}, fmt.Errorf("delayd publish: not sent: %w", notSent(err))
	case err != nil && ctx.Err() != nil:
		return Published{}, &unknownOutcome{verb: "publish", id: id, err: err}
	case err != nil:
		return Published{}, fmt.Errorf("delayd publish to %s: %w", m.Subject, err)
	}
	return Published{ID: id, Stream: ack.Stream, Sequence: ack.Sequence}, nil
}

// newID is an id for an envelope given none: a NUID, as nats.go makes for
// its inboxes (the client depends on nats.go alone).
func newID() string { return strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix) }
