package intake

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Two migrations at once run one after the other: no step of the second
// comes between the first's, and the lock is gone after both.
func TestStreamIntakeMigrationsTakeTurns(t *testing.T) {
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) { o.WorkQueue = true })()
	e.start(e.st)
	var mu sync.Mutex
	var steps []string
	opts := [2]StreamOptions{migrateOptions(), migrateOptions()}
	for i := range opts {
		who := string(rune('a' + i))
		opts[i].afterStep = func(s string) {
			mu.Lock()
			steps = append(steps, who)
			mu.Unlock()
		}
	}
	errs := make(chan error, 2)
	for _, o := range opts {
		go func() { errs <- e.migrate(context.Background(), o) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	changes := 0
	for i := 1; i < len(steps); i++ {
		if steps[i] != steps[i-1] {
			changes++
		}
	}
	if changes > 1 {
		t.Errorf("the steps of two migrations interleaved: %v", steps)
	}
	e.migrated(e.js())
	if _, err := e.js().Stream(context.Background(), lockName("DELAYD_INTAKE")); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("the lock stays after both migrations: %v", err)
	}
}

// A lock left by a run that was killed (not kept alive) is taken over.
func TestStreamIntakeMigrationTakesOverAStaleLock(t *testing.T) {
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) { o.WorkQueue = true })()
	e.start(e.st)
	js := e.js()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := anotherRunsLock(ctx, js, "killed"); err != nil {
		t.Fatal(err)
	}
	opt := migrateOptions()
	opt.lockStale = time.Second
	start := time.Now()
	if err := e.migrate(ctx, opt); err != nil {
		t.Fatalf("migrate past a stale lock: %v", err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("took over a lock %v old, before it was stale", took)
	}
	e.migrated(js)
}

// A run whose lock was taken over while it ran (another run found it stale)
// stops before its next step, and goes on only once it holds the lock
// again: the other run's steps and its own never interleave.
func TestStreamIntakeMigrationStopsWhenItsLockIsTaken(t *testing.T) {
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) { o.WorkQueue = true })()
	e.start(e.st)
	js := e.js()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opt := migrateOptions()
	opt.lockStale = time.Second
	var taken, next time.Time
	opt.afterStep = func(s string) {
		switch {
		case taken.IsZero():
			// Another run takes the lock: deleted, and created with its id
			// (it never beats: stale a second later).
			if err := js.DeleteStream(ctx, lockName("DELAYD_INTAKE")); err != nil {
				t.Error(err)
			}
			if err := anotherRunsLock(ctx, js, "another"); err != nil {
				t.Error(err)
			}
			taken = time.Now()
			time.Sleep(1500 * time.Millisecond) // its beat reads the lock back meanwhile
		case s == "created DELAYD_INTAKE_MIGRATING":
			// The park's pair, made at once: a publish finds no stream
			// between the two.
		case next.IsZero():
			next = time.Now()
		}
	}
	if err := e.migrate(ctx, opt); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if gap := next.Sub(taken); gap < 2200*time.Millisecond {
		t.Errorf("the run took its next step %v after its lock was taken: it did not wait for the lock again", gap)
	}
	e.migrated(js)
}

// anotherRunsLock creates the lock of DELAYD_INTAKE's migration as the run
// named run would, without its keep-alive.
func anotherRunsLock(ctx context.Context, js jetstream.JetStream, run string) error {
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: lockName("DELAYD_INTAKE"),
		Subjects: []string{parkSubject("delayd", lockName("DELAYD_INTAKE"))}, Storage: jetstream.MemoryStorage,
		Metadata: map[string]string{lockRunKey: run}})
	return err
}
