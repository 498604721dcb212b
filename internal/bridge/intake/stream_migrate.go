package intake

// Migrating the intake stream to the limits layout (stream_floor.go). A
// stream's retention cannot change to or from a work queue, and two
// streams cannot capture the same subjects, so the migration moves the
// intake subjects twice, through a stream between (<name>_MIGRATING):
//
//  1. park <name>: its subjects become <prefix>.parked.<name>, which no
//     publisher uses; at once create <name>_MIGRATING (limits layout)
//     with the intake subjects. A publish in between finds no stream: the
//     publisher gets no-responders (or a timeout), never a PubAck.
//  2. drain <name>: publish a barrier message into it (on its parked
//     subject, so behind every message it took before), and wait until
//     its consumer's ack floor passes the barrier with nothing pending:
//     every message it acknowledged to a publisher is settled by the
//     daemons, through the consumer they always used, so the stream
//     dedupe and the ids of envelopes without Delayd-Id stay the same.
//     Then delete it.
//  3. the same move back: park <name>_MIGRATING, create <name> (limits
//     layout, marked migratedKey), drain and delete <name>_MIGRATING,
//     and take the mark off.
//
// Every step is chosen from what the streams are now (roleOf), so a
// migration cut off anywhere goes on when run again, and two run at once
// do each step twice, harmlessly: a park is an update to the same config,
// a create of an identical stream returns it, a drain waits for the same
// floor, a delete of a deleted stream is done, and a drain deletes a
// stream only if it is still the parked stream it began on (same creation
// time): never the live one another run created since. The daemons take part
// without knowing: each binds a parked stream first (bindable), so what
// waits in one is drained even if every daemon restarts meanwhile, and
// binds again when it is deleted (Run's lost consumer).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/envelope"
)

// migratedKey marks, in the metadata of the stream a migration created
// under the configured name, the stream between that may still need a
// drain: daemons binding it look there first. The migration takes the mark
// off once that stream is gone. parkedKey says, on a parked stream, why it
// captures nothing a publisher uses.
const (
	migratedKey = "delayd_migrated_from"
	parkedKey   = "delayd_parked"
)

// drainPoll is how often a migration reads the drained stream's consumer.
const drainPoll = 250 * time.Millisecond

// barrierWait is how long a migration waits for one barrier's PubAck.
const barrierWait = 2 * time.Second

// maxStreamName is the longest JetStream stream name (the server's
// JSMaxNameLen): a migration of a name whose stream between would be longer
// is refused before it changes anything.
const maxStreamName = 255

// interimName is the stream between of a migration of name.
func interimName(name string) string { return name + "_MIGRATING" }

// parkSubject is the only subject a parked stream captures: no publisher's
// (under delayd's prefix, outside <prefix>.intake.>), unique per stream,
// and the subject of the migration's barrier messages.
func parkSubject(prefix, name string) string { return prefix + ".parked." + name }

// isParkSubject reports whether subject is one a parked stream captures.
func isParkSubject(prefix, subject string) bool { return strings.HasPrefix(subject, prefix+".parked.") }

type streamRole int

const (
	roleAbsent streamRole = iota
	// roleHolds: it captures the intake subjects.
	roleHolds
	// roleParked: a migration took its subjects off; it is drained, then
	// deleted.
	roleParked
	// roleOther: neither (another deployment's stream of that name).
	roleOther
)

func roleOf(info *jetstream.StreamInfo, prefix string) streamRole {
	switch {
	case info == nil:
		return roleAbsent
	case slices.Equal(info.Config.Subjects, []string{parkSubject(prefix, info.Config.Name)}):
		return roleParked
	case holds(info, prefix):
		return roleHolds
	}
	return roleOther
}

// holds reports whether the stream captures <prefix>.intake and
// <prefix>.intake.>.
func holds(info *jetstream.StreamInfo, prefix string) bool {
	subj := info.Config.Subjects
	return envelope.MatchAny(subj, intakeSubject(prefix)) && envelope.MatchAny(subj, intakeSubject(prefix)+".x")
}

func limitsLayout(info *jetstream.StreamInfo) bool {
	return info.Config.Retention == jetstream.LimitsPolicy && info.Config.Metadata[layoutKey] == layoutPurged
}

// bindable is the stream the intake takes from: a parked one first (its
// messages were acknowledged to publishers and wait to be stored), else
// the configured one, else the stream between while the configured one is
// gone half-way through a migration. nil, nil: there is none; create the
// configured one. The stream between is looked at only then, or when the
// configured one is parked or carries migratedKey: a daemon whose NATS user
// may not read it is not slowed down outside a migration.
func (s *StreamIntake) bindable(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, error) {
	n, err := js.Stream(ctx, s.opt.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		n = nil
	case err != nil:
		return nil, err
	default:
		info := n.CachedInfo()
		if roleOf(info, s.opt.Subject) == roleParked {
			return n, nil
		}
		if _, ok := info.Config.Metadata[migratedKey]; !ok {
			return n, nil
		}
	}
	// A NATS user without the rights on it (the permission block of an
	// earlier version) gets no answer at all: waited for briefly.
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	t, err := js.Stream(tctx, interimName(s.opt.Name))
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return n, nil
	case err != nil && ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		s.log.Warn("cannot read the stream between of a migration (needs $JS.API.STREAM.INFO."+interimName(s.opt.Name)+"); going on without it",
			"error", err)
		return n, nil
	}
	if r := roleOf(t.CachedInfo(), s.opt.Subject); r == roleParked || (n == nil && r == roleHolds) {
		return t, nil
	}
	return n, nil
}

// boundName is the name of the stream the intake takes from.
func (s *StreamIntake) boundName() string {
	if b := s.bound.Load(); b != nil {
		return b.name
	}
	return s.opt.Name
}

// migration moves the intake of opt.Name to the limits layout.
type migration struct {
	js    jetstream.JetStream
	opt   StreamOptions
	log   hclog.Logger
	hook  func(step string)
	names [2]string // the configured stream, the stream between
	held  *migrationLock
}

// MigrateIntake moves the intake stream opt.Name from a work queue (the
// layout before 0.2.0) to the limits layout, losing and repeating nothing,
// while daemons run: they store what the old stream holds. It returns when
// the stream of that name captures the intake subjects with the limits
// layout and nothing else remains to drain, or with ctx's error: run it
// again to go on from where it stopped. Safe to run twice at once.
func MigrateIntake(ctx context.Context, nc *nats.Conn, opt StreamOptions, log hclog.Logger) error {
	if opt.WorkQueue {
		return errors.New("bridge: intake.stream.retention is workqueue: the migration makes the limits layout (set intake.stream.retention: limits)")
	}
	if len(interimName(opt.Name)) > maxStreamName { // and lockName(opt.Name), shorter
		return fmt.Errorf("bridge: intake.stream.name is %d characters: the migration creates %s, and a JetStream name is %d at most (the name %d at most); nothing changed",
			len(opt.Name), interimName("<name>"), maxStreamName, maxStreamName-len(interimName("")))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("bridge: jetstream: %w", err)
	}
	m := &migration{js: js, opt: opt, log: log, hook: opt.afterStep, names: [2]string{opt.Name, interimName(opt.Name)}}
	if m.hook == nil {
		m.hook = func(string) {}
	}
	if opt.unlocked {
		return m.run(ctx)
	}
	for {
		l, err := m.lock(ctx)
		if err != nil {
			return err
		}
		m.held = l
		err = m.run(ctx)
		l.release()
		if !errors.Is(err, errLockLost) {
			return err
		}
		log.Warn("another run took the migration's lock over while this one ran (cut off from NATS?); waiting for it again")
	}
}

func (m *migration) run(ctx context.Context) error {
	name, between := m.names[0], m.names[1]
	failed := 0
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if m.held != nil && m.held.lost.Load() {
			return errLockLost
		}
		n, err := m.look(ctx, name)
		if err != nil {
			return err
		}
		t, err := m.look(ctx, between)
		if err != nil {
			return err
		}
		rn, rt := roleOf(n, m.opt.Subject), roleOf(t, m.opt.Subject)
		switch {
		case rn == roleParked && rt == roleAbsent:
			err = m.create(ctx, between, "")
		case rt == roleParked && rn == roleAbsent:
			err = m.create(ctx, name, between)
		case rn == roleParked:
			err = m.drain(ctx, n)
		case rt == roleParked:
			err = m.drain(ctx, t)
		case rn == roleHolds && limitsLayout(n) && rt == roleAbsent:
			if err = m.done(ctx, n); err == nil {
				return nil
			}
		case rn == roleHolds && n.Config.Retention == jetstream.WorkQueuePolicy && rt == roleAbsent:
			if err = m.park(ctx, n, between); err == nil && ctx.Err() == nil {
				err = m.create(ctx, between, "")
			}
		case rn == roleHolds && rt == roleAbsent:
			return fmt.Errorf("bridge: stream %s is not delayd's work queue (retention %s, metadata %v): not migrating a stream delayd did not create",
				name, n.Config.Retention, n.Config.Metadata)
		case rn == roleAbsent && rt == roleHolds:
			if err = m.park(ctx, t, name); err == nil && ctx.Err() == nil {
				err = m.create(ctx, name, between)
			}
		case rn == roleAbsent && rt == roleAbsent:
			m.log.Info("no intake stream: nothing to migrate (the daemons create it with the limits layout)", "stream", name)
			return nil
		default:
			return fmt.Errorf("bridge: streams %s (subjects %v) and %s (subjects %v) are not what a migration leaves: %w",
				name, subjectsOf(n), between, subjectsOf(t), errStreamClash)
		}
		if err != nil && serverFailed(err) && failed < maxServerFailures {
			// Two migrations changing one stream at once can make the
			// server fail one change (it writes the stream's metadata
			// file in place): every step is chosen again from what the
			// streams are now, so it is tried again.
			failed++
			m.log.Warn("the server failed a change of the intake streams; looking again", "error", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(drainPoll):
			}
			continue
		}
		if err != nil {
			return err
		}
	}
}

// maxServerFailures is how many server failures a migration retries.
const maxServerFailures = 5

// serverFailed: err is a JetStream API error of the server's own (500).
func serverFailed(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code == 500
}

func subjectsOf(info *jetstream.StreamInfo) []string {
	if info == nil {
		return nil
	}
	return info.Config.Subjects
}

// look reads the stream name: nil when there is none.
func (m *migration) look(ctx context.Context, name string) (*jetstream.StreamInfo, error) {
	st, err := m.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bridge: read stream %s: %w", name, err)
	}
	return st.CachedInfo(), nil
}

// park takes the intake subjects off the stream: from here until the
// create that follows, a publish finds no stream.
func (m *migration) park(ctx context.Context, info *jetstream.StreamInfo, to string) error {
	cfg := info.Config
	cfg.Subjects = []string{parkSubject(m.opt.Subject, cfg.Name)}
	cfg.Metadata = maps.Clone(cfg.Metadata)
	if cfg.Metadata == nil {
		cfg.Metadata = map[string]string{}
	}
	cfg.Metadata[parkedKey] = "intake subjects moved to " + to + "; the daemons drain it, delayd intake migrate deletes it"
	if _, err := m.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bridge: take the intake subjects off stream %s: %w", cfg.Name, err)
	}
	m.log.Info("took the intake subjects off the stream; the daemons drain it", "stream", cfg.Name)
	m.step("parked " + cfg.Name)
	return nil
}

// create makes the stream name capture the intake subjects, with the
// limits layout; from marks the stream between it was migrated from.
func (m *migration) create(ctx context.Context, name, from string) error {
	cfg := streamConfigOf(m.opt, name)
	if from != "" {
		cfg.Metadata[migratedKey] = from
	}
	_, err := m.js.CreateStream(ctx, cfg)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("bridge: create stream %s with the intake subjects: %w", name, err)
	}
	m.log.Info("the intake subjects are on the stream", "stream", name)
	m.step("created " + name)
	return nil
}

// drain waits until the daemons settled every message of the parked stream
// parked, then deletes it: only while it is still that stream. Another
// migration run at the same time may have drained and deleted it, and
// gone on to create a stream of that name, the live one holding the intake
// subjects: that is never deleted (moved).
func (m *migration) drain(ctx context.Context, parked *jetstream.StreamInfo) error {
	name, created := parked.Config.Name, parked.Created
	seq, err := m.barrier(ctx, name, created)
	if errors.Is(err, errDrained) {
		return nil
	}
	if err != nil {
		return err
	}
	m.log.Info("waiting for the daemons to store what the stream holds", "stream", name, "up_to_sequence", seq)
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	said, waiting := time.Now(), false
	for {
		c, err := m.js.Consumer(ctx, name, name)
		var info *jetstream.ConsumerInfo
		if err == nil {
			info, err = c.Info(ctx)
		}
		if err == nil && info.AckFloor.Stream >= seq && info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		if err != nil && m.moved(ctx, name, created) {
			return nil
		}
		if !waiting {
			waiting = true
			m.step("waiting " + name)
		}
		if time.Since(said) >= 10*time.Second {
			said = time.Now()
			if err != nil {
				m.log.Warn("no daemon drains the stream yet (are they running, with its permissions?)", "stream", name, "error", err)
			} else {
				m.log.Info("still draining", "stream", name, "ack_floor", info.AckFloor.Stream, "up_to_sequence", seq,
					"pending", info.NumPending, "unacknowledged", info.NumAckPending)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	// What was just read may be the consumer of a stream created since
	// under that name: looked at again right before the delete.
	if still, err := m.still(ctx, name, created); err != nil || !still {
		return err
	}
	if err := m.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("bridge: delete the drained stream %s: %w", name, err)
	}
	m.log.Info("deleted the drained stream", "stream", name)
	m.step("deleted " + name)
	return nil
}

// barrier publishes an empty message into the parked stream name, on its
// parked subject, and returns its sequence. Every message the stream took
// on the intake subjects is ahead of it: one the server had received when
// the subjects changed is stored before it, so a drain past it misses
// none. Until the stream has its parked subject nothing answers, and a
// stream another migration deletes meanwhile never answers (the publish
// times out): retried after looking whether it moved. A barrier stored
// whose answer was lost is harmless: the next one is behind it.
func (m *migration) barrier(ctx context.Context, name string, created time.Time) (uint64, error) {
	for {
		pctx, cancel := context.WithTimeout(ctx, barrierWait)
		ack, err := m.js.Publish(pctx, parkSubject(m.opt.Subject, name), nil, jetstream.WithExpectStream(name))
		cancel()
		if err == nil {
			return ack.Sequence, nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, context.DeadlineExceeded) {
			return 0, fmt.Errorf("bridge: publish the barrier into stream %s: %w", name, err)
		}
		if m.moved(ctx, name, created) {
			return 0, errDrained
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(drainPoll):
		}
	}
}

// errDrained: the stream is gone, drained and deleted by another
// migration run at the same time.
var errDrained = errors.New("drained and deleted by another migration")

// moved reports whether the stream name is no longer the parked stream
// created at created that a drain began on: deleted (only a migration
// deletes one, once drained; its consumer and parked subject go with it,
// so a drain waiting on either would wait for ever), or a stream created
// since under that name (by another migration run at the same time,
// possibly the live one). Either way the migration looks again at what
// the streams are. A stream that cannot be read has not moved: the drain
// neither deletes it nor stops waiting.
func (m *migration) moved(ctx context.Context, name string, created time.Time) bool {
	still, err := m.still(ctx, name, created)
	return err == nil && !still
}

// still reports whether the stream name is the parked stream created at
// created; an error when it cannot be read.
func (m *migration) still(ctx context.Context, name string, created time.Time) (bool, error) {
	st, err := m.js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		m.log.Info("the stream was drained and deleted by another migration", "stream", name)
		return false, nil
	case err != nil:
		return false, fmt.Errorf("bridge: read stream %s: %w", name, err)
	}
	info := st.CachedInfo()
	if roleOf(info, m.opt.Subject) != roleParked || !info.Created.Equal(created) {
		m.log.Info("the stream was drained and deleted by another migration, which created one of that name since: looking again",
			"stream", name, "subjects", info.Config.Subjects)
		return false, nil
	}
	return true, nil
}

// done takes the migration's mark off the stream it created, once nothing
// remains to drain.
func (m *migration) done(ctx context.Context, info *jetstream.StreamInfo) error {
	if _, ok := info.Config.Metadata[migratedKey]; ok {
		cfg := info.Config
		cfg.Metadata = maps.Clone(cfg.Metadata)
		delete(cfg.Metadata, migratedKey)
		if _, err := m.js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("bridge: take the migration's mark off stream %s: %w", cfg.Name, err)
		}
		m.log.Info("migrated: the intake stream has the limits layout", "stream", cfg.Name)
		return nil
	}
	m.log.Info("the intake stream has the limits layout: nothing to migrate", "stream", info.Config.Name)
	return nil
}

func (m *migration) step(s string) { m.hook(s) }
