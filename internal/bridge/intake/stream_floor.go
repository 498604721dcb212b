package intake

// The intake stream's floor: the stream sequence up to which every
// message is settled, kept in Redis so that a consumer created again
// (deleted behind delayd's back) starts after it instead of at the
// stream's first message. On a stream with limits or interest retention
// the messages delayd acknowledged stay; a consumer that started over
// would store every one of them again, and once the stream dedupe window
// had passed deliver them again as attempt 1.
//
// The floor is the consumer's ack floor as the server reports it, not the
// highest sequence this daemon stored: a lower message may still be
// unsettled (offered again while Redis was down, or held by another
// daemon), and starting after a higher one would skip it for good. What
// was acked after the last save is offered again to the new consumer and
// caught by the stream dedupe window (intake.stream.dedupe_window).

//
// On the stream delayd creates (limits retention, marked with layoutKey),
// the floor also says what may go: every message at or below it is
// settled, by whichever daemon took it, so the daemons purge below it
// (purgeEvery). An ack then deletes nothing. On a work-queue stream each
// ack deletes its message, one tombstone write each in nats-server's file
// store: most of nats-server's time on the intake went there. Purging a
// range drops whole blocks. A stream delayd did not create is never
// purged: it may have readers of its own.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// layoutKey marks, in the stream's metadata, a stream delayd created to be
// purged below its consumer's ack floor (layoutPurged).
const (
	layoutKey    = "delayd_layout"
	layoutPurged = "limits-purged-below-ack-floor"
)

// purgeEvery bounds the purges: at most one JetStream API request per
// interval and daemon.
const purgeEvery = time.Second

// floorEvery is how often, while messages are being settled, the floor is
// read from the consumer and saved: at most one JetStream API request and
// one Redis call per interval and daemon.
const floorEvery = 250 * time.Millisecond

// boundConsumer is the consumer the intake takes from and the creation
// time of its stream.
type boundConsumer struct {
	cons jetstream.Consumer
	// name is the stream's and the consumer's: opt.Name, or half-way
	// through a migration the stream drained or the one between.
	name    string
	created int64 // ns
	// stream is set when it is purged below the floor; purged is the
	// floor purged to, and when.
	stream   jetstream.Stream
	purged   atomic.Uint64
	purgedAt atomic.Int64 // ns
	// lastFloor is the floor last read, trail the reads since it moved
	// (trailAcks).
	lastFloor atomic.Uint64
	trail     atomic.Int32
	unmarked  atomic.Bool // warned that the mark is gone
}

// startAfterFloor sets where the consumer cfg starts. An existing one
// keeps its start (JetStream does not change it). A new one, or one made
// again after it was deleted, starts after the floor saved for this
// stream, or at its first message when none was saved (a new stream). A
// floor Redis cannot say is an error, retried, except on a work-queue
// stream: acknowledged messages are gone from it, so starting at its
// first message repeats nothing.
func (s *StreamIntake) startAfterFloor(ctx context.Context, st jetstream.Stream, info *jetstream.StreamInfo, cfg *jetstream.ConsumerConfig) error {
	workQueue := info.Config.Retention == jetstream.WorkQueuePolicy
	name := info.Config.Name
	existing, err := st.Consumer(ctx, name)
	switch {
	case err == nil:
		c := existing.CachedInfo().Config
		cfg.DeliverPolicy, cfg.OptStartSeq = c.DeliverPolicy, c.OptStartSeq
		return nil
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	case workQueue:
		// Refused, most likely: a NATS user without
		// $JS.API.CONSUMER.INFO for it (the permission block of an
		// earlier version). Safe on a work queue, as below.
		s.log.Warn("cannot read the intake consumer; a work-queue stream holds only unsettled messages, so the consumer is set up from its first",
			"stream", name, "error", err)
		return nil
	default:
		return err
	}
	floor, err := s.store.IntakeFloor(ctx, name, info.Created.UnixNano())
	switch {
	case err != nil && workQueue:
		s.log.Warn("cannot read the intake stream's floor from Redis; a work-queue stream holds only unsettled messages, starting at its first",
			"stream", name, "error", err)
		return nil
	case err != nil:
		return err
	case floor == 0:
		return nil
	}
	cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, floor+1
	s.log.Info("creating the intake consumer after the last settled message", "stream", name, "start_sequence", floor+1)
	return nil
}

// keepFloor saves the floor every floorEvery while messages are settled,
// until ctx ends.
func (s *StreamIntake) keepFloor(ctx context.Context) {
	t := time.NewTicker(floorEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.settled.Swap(false) {
				if !s.saveFloor(ctx) {
					s.settled.Store(true) // again at the next tick
				}
			}
		}
	}
}

// streamGone reports whether err, from the bound consumer, is because its
// stream was deleted (or deleted and created again): the server then says
// the consumer is not found.
func (s *StreamIntake) streamGone(ctx context.Context, b *boundConsumer, err error) bool {
	if !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return false
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return false
	}
	st, err := js.Stream(ctx, b.name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return true
	}
	return err == nil && st.CachedInfo().Created.UnixNano() != b.created
}

// saveFloor reads the consumer's ack floor and saves it in Redis.
func (s *StreamIntake) saveFloor(ctx context.Context) bool {
	b := s.bound.Load()
	if b == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := b.cons.Info(ctx)
	if err == nil {
		err = s.store.SaveIntakeFloor(ctx, b.name, b.created, info.AckFloor.Stream)
	}

	if err != nil && s.streamGone(ctx, b, err) {
		// Nothing is left in it that a consumer created again could
		// store again: Run binds the stream that holds the subjects now.
		s.log.Info("the intake stream is gone (delayd intake migrate deletes each stream it drained, once empty): no floor to save for it",
			"stream", b.name)
		return true
	}
	if err != nil {
		// Said once per cause: a refusal (the NATS user may not read
		// the consumer's info) would otherwise turn the floor off
		// silently.
		msg := err.Error()
		if prev := s.floorWarned.Swap(&msg); prev == nil || *prev != msg {
			s.log.Warn("cannot save the intake stream's floor; a consumer created again may store again what was stored (retrying)",
				"stream", b.name, "error", err)
		}
		return false
	}
	s.floorWarned.Store(nil)
	// After the save: a consumer made again starts above what goes.
	if err := s.purge(ctx, b, info.AckFloor.Stream); err != nil {
		msg := err.Error()
		if prev := s.purgeWarned.Swap(&msg); prev == nil || *prev != msg {
			s.log.Warn("cannot purge the settled messages from the intake stream; they stay until it can (retrying)",
				"stream", b.name, "error", err)
		}
		return false
	}
	s.purgeWarned.Store(nil)
	s.trailAcks(b, info.AckFloor.Stream, info.Delivered.Stream)
	return true
}

// trailingChecks bounds the ticks a floor below what the consumer
// delivered is read again without progress.
const trailingChecks = 8

// trailAcks keeps the floor read at the next ticks while it is below what
// the consumer delivered: the last acks may have been on their way when it
// was read, and would otherwise be saved (and purged) only at the next
// settle, on an idle stream never. While the floor moves it keeps looking;
// after trailingChecks ticks without progress (messages held, offered
// again later: Redis down) it waits for the next settle.
func (s *StreamIntake) trailAcks(b *boundConsumer, floor, delivered uint64) {
	if floor > b.lastFloor.Swap(floor) {
		b.trail.Store(0)
	}
	if floor < delivered && b.trail.Add(1) <= trailingChecks {
		s.settled.Store(true)
	}
}

// purge drops the messages of a stream delayd created at and below floor,
// the consumer's ack floor: all settled. At most every purgeEvery; a floor
// it did not purge to is purged at a later save.
func (s *StreamIntake) purge(ctx context.Context, b *boundConsumer, floor uint64) error {
	now := s.opt.Now().UnixNano()
	if b.stream == nil || floor <= b.purged.Load() || now-b.purgedAt.Load() < int64(purgeEvery) {
		if b.stream != nil && floor > b.purged.Load() {
			s.settled.Store(true) // not purged yet: again at a later tick
		}
		return nil
	}
	// The stream as it is now, not as it was bound: an operator may have
	// taken the mark off (it has other readers now), or the stream may
	// have been made again since the floor was read (the floor is the old
	// one's).
	info, err := b.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("read the stream before purging: %w", err)
	}
	if info.Config.Metadata[layoutKey] != layoutPurged || info.Created.UnixNano() != b.created {
		b.purgedAt.Store(now) // look again no sooner than purgeEvery
		if b.unmarked.CompareAndSwap(false, true) {
			s.log.Warn("the intake stream lost delayd's layout mark or was made again: not purging it",
				"stream", b.name, "metadata", info.Config.Metadata)
		}
		return nil
	}
	b.unmarked.Store(false)
	if err := b.stream.Purge(ctx, jetstream.WithPurgeSequence(floor+1)); err != nil {
		return fmt.Errorf("purge below the ack floor %d (needs $JS.API.STREAM.PURGE.%s): %w", floor, b.name, err)
	}
	b.purged.Store(floor)
	b.purgedAt.Store(now)
	return nil
}
