package intake

// The migration's lock. nats-server does not serialize two API calls that
// change the same streams at once (a single server writes a stream's
// metadata file in place, and checks two streams' subjects for overlap
// apart from creating them): two migrations run at once made it fail a
// change (500, "meta.inf.tmp: no such file"), leave two streams capturing
// the intake subjects, or a stream that took no more publishes. So one
// migration of a stream runs at a time: it holds a stream of its own,
// <name>_LOCK, created with the run's id (a create of that name with
// another config is refused, so one run wins), kept alive by a message
// every lockBeat, and deleted when the run ends. A run killed leaves it:
// a lock whose keep-alive sequence did not move for lockStale (this
// host's time, so no two clocks are compared) is taken over. Two runs
// that take over one stale lock at once can both create theirs, one
// after the other deleting the first: every beat reads the lock back,
// and a run that finds it gone or another's stops before its next step
// and waits for the lock again (errLockLost).

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	lockBeat  = time.Second
	lockStale = 15 * time.Second
	// lockRunKey names, in the lock stream's metadata, the run holding it.
	lockRunKey = "delayd_migration_run"
)

// lockName is the lock stream of a migration of name.
func lockName(name string) string { return name + "_LOCK" }

// migrationLock is a held lock.
type migrationLock struct {
	js      jetstream.JetStream
	name    string
	run     string
	created time.Time
	lost    atomic.Bool // a beat found the lock gone or another run's
	stop    chan struct{}
	done    chan struct{}
}

// errLockLost stops a run whose lock was taken over while it ran.
var errLockLost = errors.New("bridge: the migration's lock was taken over while this run held it")

// lock waits until this run holds the lock of the migration, or ctx ends.
func (m *migration) lock(ctx context.Context) (*migrationLock, error) {
	name := lockName(m.opt.Name)
	run := nats.NewInbox()[len(nats.InboxPrefix):]
	subject := parkSubject(m.opt.Subject, name)
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage,
		MaxMsgs: 1, Replicas: m.opt.Replicas, Metadata: map[string]string{lockRunKey: run},
		Description: "held by a running delayd intake migrate; deleted when it ends"}
	stale := m.opt.lockStale
	if stale == 0 {
		stale = lockStale
	}
	waiting := false
	// The lock held by another run, and when its keep-alive sequence was
	// last seen to move, by this host's clock.
	var seen struct {
		created time.Time
		seq     uint64
		at      time.Time
	}
	tookOver := false
	for {
		st, err := m.js.CreateStream(ctx, cfg)
		if err == nil && st.CachedInfo().Config.Metadata[lockRunKey] == run {
			l := &migrationLock{js: m.js, name: name, run: run, created: st.CachedInfo().Created,
				stop: make(chan struct{}), done: make(chan struct{})}
			go l.beat(subject)
			if tookOver {
				// Another run may have taken the same stale lock over at
				// once and be about to delete this one: its beat tells.
				select {
				case <-ctx.Done():
					l.release()
					return nil, ctx.Err()
				case <-time.After(2 * lockBeat):
				}
				if l.lost.Load() {
					l.release()
					tookOver, seen.created = false, time.Time{}
					continue
				}
			}
			return l, nil
		}
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("bridge: take the migration's lock, stream %s (needs $JS.API.STREAM.CREATE, INFO and DELETE of it, and publish on %s): %w",
				name, subject, err)
		}
		held, err := m.js.Stream(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			continue // released meanwhile
		case err != nil:
			return nil, fmt.Errorf("bridge: read the migration's lock, stream %s: %w", name, err)
		}
		info := held.CachedInfo()
		if !info.Created.Equal(seen.created) || info.State.LastSeq != seen.seq {
			seen.created, seen.seq, seen.at = info.Created, info.State.LastSeq, time.Now()
		}
		if age := time.Since(seen.at); age > stale {
			m.log.Warn("taking over the lock of a migration not kept alive (a run stopped without releasing it)",
				"stream", name, "silent_for", age.Round(time.Second))
			if still, err := m.js.Stream(ctx, name); err == nil && still.CachedInfo().Created.Equal(info.Created) &&
				still.CachedInfo().State.LastSeq == seen.seq {
				if err := m.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
					return nil, fmt.Errorf("bridge: delete the stale migration lock %s: %w", name, err)
				}
			}
			tookOver = true
			continue
		}
		if !waiting {
			waiting = true
			m.log.Info("another delayd intake migrate runs; waiting for it to end", "lock", name, "since", info.Created)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(lockBeat):
		}
	}
}

// beat keeps the lock alive until release.
func (l *migrationLock) beat(subject string) {
	defer close(l.done)
	tick := time.NewTicker(lockBeat)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), lockBeat)
		_, _ = l.js.Publish(ctx, subject, nil, jetstream.WithExpectStream(l.name))
		st, err := l.js.Stream(ctx, l.name)
		cancel()
		if errors.Is(err, jetstream.ErrStreamNotFound) || (err == nil && st.CachedInfo().Config.Metadata[lockRunKey] != l.run) {
			l.lost.Store(true)
			return
		}
	}
}

// release deletes the lock if this run still holds it.
func (l *migrationLock) release() {
	select {
	case <-l.done: // the beat found the lock lost
	default:
		close(l.stop)
		<-l.done
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := l.js.Stream(ctx, l.name)
	if err != nil || st.CachedInfo().Config.Metadata[lockRunKey] != l.run {
		return
	}
	_ = l.js.DeleteStream(ctx, l.name)
}
