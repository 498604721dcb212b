package intake

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// storeCounts wraps a StreamStore and counts, per id, the times an
// envelope was written (Schedule returned a due time > 0): one id written
// twice is a repeat.
type storeCounts struct {
	StreamStore
	mu      sync.Mutex
	written map[string]int
}

func countWrites(st StreamStore) *storeCounts {
	return &storeCounts{StreamStore: st, written: map[string]int{}}
}

func (c *storeCounts) Schedule(ctx context.Context, items []store.Item) ([]store.Scheduled, []error) {
	due, errs := c.StreamStore.Schedule(ctx, items)
	c.mu.Lock()
	for i, it := range items {
		if errs[i] == nil && due[i].Kind == store.Stored {
			c.written[it.ID]++
		}
	}
	c.mu.Unlock()
	return due, errs
}

// check fails the test for an acknowledged id never written or one
// written twice.
func (c *storeCounts) check(t *testing.T, acked []string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	lost, twice := 0, 0
	for _, id := range acked {
		switch n := c.written[id]; {
		case n == 0:
			lost++
		case n > 1:
			twice++
		}
	}
	t.Logf("%d acknowledged by the stream, %d ids written", len(acked), len(c.written))
	if lost != 0 || twice != 0 {
		t.Fatalf("%d acknowledged envelopes never stored, %d stored twice", lost, twice)
	}
}

// missing is how many of ids were never written.
func (c *storeCounts) missing(ids []string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, id := range ids {
		if c.written[id] == 0 {
			n++
		}
	}
	return n
}

// publisher publishes envelopes with ids <prefix>-<i> into the intake
// until stopped, retrying a publish nothing answers (the subjects between
// two streams) as a publisher would, and records what a PubAck confirmed.
type publisher struct {
	mu      sync.Mutex
	acked   []string
	lastErr error // the last publish that failed, for a failure's message
	stop    chan struct{}
	done    chan struct{}
}

func startPublisher(t *testing.T, js jetstream.JetStream, prefix string) *publisher {
	p := &publisher{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			default:
			}
			id := fmt.Sprintf("%s-%d", prefix, i)
			m := &nats.Msg{Subject: "delayd.intake", Data: []byte("x"), Header: hdr(envelope.HeaderTarget, "orders.cancel",
				envelope.HeaderDelay, "1h", envelope.HeaderID, id)}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := js.PublishMsg(ctx, m, jetstream.WithRetryAttempts(50), jetstream.WithRetryWait(20*time.Millisecond))
			cancel()
			p.mu.Lock()
			if err == nil {
				p.acked = append(p.acked, id)
			} else {
				p.lastErr = err
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(p.end)
	return p
}

// waitAcked waits until n more publishes than now are acknowledged.
func (p *publisher) waitAcked(e *streamEnv, n int) {
	e.t.Helper()
	base := len(p.ids())
	for deadline := time.Now().Add(20 * time.Second); len(p.ids()) < base+n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting until %d more publishes acknowledged (after %d, %d now; the last publish error: %v)",
				n, base, len(p.ids()), p.failure())
		}
	}
}

func (p *publisher) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

func (p *publisher) ids() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.acked)
}

func (p *publisher) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

func migrateOptions() StreamOptions {
	return StreamOptions{Options: Options{Subject: "delayd"},
		Name: "DELAYD_INTAKE", Replicas: 1}
}

// migrate runs MigrateIntake on a connection of its own.
func (e *streamEnv) migrate(ctx context.Context, opt StreamOptions) error {
	nc, err := nats.Connect(e.url)
	if err != nil {
		return err
	}
	defer nc.Close()
	return MigrateIntake(ctx, nc, opt, hclog.NewNullLogger())
}

// migrated checks the end state: DELAYD_INTAKE holds the intake subjects
// with the limits layout, and the stream of the way between is gone.
func (e *streamEnv) migrated(js jetstream.JetStream) {
	e.t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, "DELAYD_INTAKE")
	if err != nil {
		e.t.Fatal(err)
	}
	c := s.CachedInfo().Config
	if c.Retention != jetstream.LimitsPolicy || c.Metadata[layoutKey] != layoutPurged || !slices.Equal(c.Subjects, []string{"delayd.intake", "delayd.intake.>"}) {
		e.t.Fatalf("after the migration: retention %v, metadata %v, subjects %v", c.Retention, c.Metadata, c.Subjects)
	}
	if _, ok := c.Metadata[migratedKey]; ok {
		e.t.Errorf("the migration's mark %s stays on the stream", migratedKey)
	}
	if _, err := js.Stream(ctx, interimName("DELAYD_INTAKE")); !errors.Is(err, jetstream.ErrStreamNotFound) {
		e.t.Fatalf("the stream of the way between is still there: %v", err)
	}
}

// A work-queue intake stream (the layout before 0.2.0) becomes the limits
// layout under two daemons and steady publishing, by two migrations run at
// once: every envelope a PubAck confirmed is stored exactly once, before,
// during and after, and publishes go on after it.
func TestStreamIntakeMigratesAWorkQueue(t *testing.T) {
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) { o.WorkQueue = true })() // the old layout, then stopped
	st := countWrites(e.st)
	e.start(st)
	e.start(st)
	js := e.js()
	p := startPublisher(t, js, "m")
	p.waitAcked(e, 200)
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- e.migrate(context.Background(), migrateOptions()) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	p.waitAcked(e, 200)
	p.end()
	acked := p.ids()
	e.eventually("every acknowledged envelope is stored", func() bool { return st.missing(acked) == 0 })
	st.check(t, acked)
	e.migrated(js)
}

// A migration cut off after any of its steps (the command killed) goes on
// from there when run again, and nothing is lost or stored twice.
func TestStreamIntakeMigrationResumes(t *testing.T) {
	for _, step := range []string{"parked DELAYD_INTAKE", "created DELAYD_INTAKE_MIGRATING", "deleted DELAYD_INTAKE",
		"parked DELAYD_INTAKE_MIGRATING", "created DELAYD_INTAKE", "deleted DELAYD_INTAKE_MIGRATING"} {
		t.Run(step, func(t *testing.T) {
			e := newStreamEnv(t)
			e.start(e.st, func(o *StreamOptions) { o.WorkQueue = true })()
			st := countWrites(e.st)
			e.start(st)
			js := e.js()
			p := startPublisher(t, js, "r")
			p.waitAcked(e, 100)
			ctx, cancel := context.WithCancel(context.Background())
			opt := migrateOptions()
			opt.afterStep = func(s string) {
				if s == step {
					cancel()
				}
			}
			if err := e.migrate(ctx, opt); !errors.Is(err, context.Canceled) {
				t.Fatalf("migrate cut off after %s: %v", step, err)
			}
			// A daemon started now binds what it finds half-way. Cut off
			// after a park, no stream holds the intake subjects: nothing
			// is acknowledged until the migration goes on.
			e.start(st)
			if !strings.HasPrefix(step, "parked") {
				p.waitAcked(e, 50)
			}
			if err := e.migrate(context.Background(), migrateOptions()); err != nil {
				t.Fatalf("migrate again: %v", err)
			}
			p.waitAcked(e, 100)
			p.end()
			acked := p.ids()
			e.eventually("every acknowledged envelope is stored", func() bool { return st.missing(acked) == 0 })
			st.check(t, acked)
			e.migrated(js)
		})
	}
}

// A stream the layout already suits, or an operator's stream, is left as
// it is.
func TestStreamIntakeMigrateLeavesOthersAlone(t *testing.T) {
	e := newStreamEnv(t)
	e.start(e.st)()
	if err := e.migrate(context.Background(), migrateOptions()); err != nil {
		t.Fatalf("migrate a stream of the limits layout: %v", err)
	}
	e.migrated(e.js())

	o := newStreamEnv(t)
	js := o.js()
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "DELAYD_INTAKE",
		Subjects: []string{"delayd.intake", "delayd.intake.>"}, Retention: jetstream.InterestPolicy}); err != nil {
		t.Fatal(err)
	}
	if err := o.migrate(context.Background(), migrateOptions()); err == nil {
		t.Fatal("an operator's interest stream was migrated")
	}
}

// refusing fails every write while down is set, as Redis down would.
type refusing struct {
	StreamStore
	down atomic.Bool
}

func (r *refusing) Schedule(ctx context.Context, items []store.Item) ([]store.Scheduled, []error) {
	if r.down.Load() {
		due, errs := make([]store.Scheduled, len(items)), make([]error, len(items))
		for i := range errs {
			errs[i] = fmt.Errorf("redis down: %w", store.ErrNotWritten)
		}
		return due, errs
	}
	return r.StreamStore.Schedule(ctx, items)
}

// While Redis cannot store, the old stream's messages stay unsettled: the
// migration waits for them (it deletes the old stream only once every
// message in it is settled), and they are stored once Redis is back.
func TestStreamIntakeMigrationWaitsForUnsettled(t *testing.T) {
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) { o.WorkQueue = true })()
	st := countWrites(e.st)
	r := &refusing{StreamStore: st}
	r.down.Store(true)
	e.start(r)
	js := e.js()
	var acked []string
	for i := range 50 {
		id := fmt.Sprint("u-", i)
		publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h", envelope.HeaderID, id), "x")
		acked = append(acked, id)
	}
	e.eventually("a store attempt failed", func() bool { return e.obs.get("unavailable") > 0 })
	opt := migrateOptions()
	// Redis comes back once the migration has found the old stream not
	// drained.
	opt.afterStep = func(s string) {
		if s == "waiting DELAYD_INTAKE" {
			r.down.Store(false)
		}
	}
	if err := e.migrate(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	e.eventually("every acknowledged envelope is stored", func() bool { return st.missing(acked) == 0 })
	st.check(t, acked)
	e.migrated(js)
}

// Of two migrations run at once, the one that finds the stream it drains
// deleted by the other (its consumer and parked subject gone with it) goes
// on instead of waiting for ever.
func TestStreamIntakeMigrationBesideAnother(t *testing.T) {
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) { o.WorkQueue = true })()
	st := countWrites(e.st)
	r := &refusing{StreamStore: st}
	r.down.Store(true)
	e.start(r)
	js := e.js()
	var acked []string
	for i := range 20 {
		id := fmt.Sprint("b-", i)
		publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h", envelope.HeaderID, id), "x")
		acked = append(acked, id)
	}
	deleted := make(chan struct{})
	// Two runs overlapping, as a run whose lock was taken over while it
	// still ran does with the next one.
	first, second := migrateOptions(), migrateOptions()
	first.unlocked, second.unlocked = true, true
	first.afterStep = func(s string) {
		if s == "deleted DELAYD_INTAKE" {
			close(deleted)
		}
	}
	// The second finds the old stream not drained, lets Redis store, and
	// looks again only once the first deleted the stream.
	second.afterStep = func(s string) {
		if s == "waiting DELAYD_INTAKE" {
			r.down.Store(false)
			<-deleted
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- e.migrate(ctx, second) }()
	e.eventually("the second waits", func() bool { return !r.down.Load() })
	go func() { errs <- e.migrate(ctx, first) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	e.eventually("every acknowledged envelope is stored", func() bool { return st.missing(acked) == 0 })
	st.check(t, acked)
	e.migrated(js)
}

// A migration that began draining the parked stream, then was overtaken by
// another that finished the whole migration (the stream of that name is
// now the live one, its consumer past the first's barrier), never deletes
// the live stream: it finds that stream is not the one it was draining and
// goes on from what the streams are now. Nothing acknowledged is lost.
func TestStreamIntakeMigrationOvertakenKeepsTheLiveStream(t *testing.T) {
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) { o.WorkQueue = true })()
	st := countWrites(e.st)
	r := &refusing{StreamStore: st}
	r.down.Store(true)
	e.start(r)
	js := e.js()
	ctx := context.Background()
	var acked []string
	send := func(prefix string, n int) {
		for i := range n {
			id := fmt.Sprint(prefix, i)
			publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h", envelope.HeaderID, id), "x")
			acked = append(acked, id)
		}
	}
	send("o-", 20)
	var live time.Time
	first := migrateOptions()
	first.unlocked = true // overtaken as after its lock was taken over
	// The first finds the parked stream not drained; meanwhile the second
	// runs the whole migration and the live stream settles more messages
	// than the first's barrier sequence; then the first looks again.
	first.afterStep = func(s string) {
		if s != "waiting DELAYD_INTAKE" {
			return
		}
		r.down.Store(false)
		if err := e.migrate(ctx, migrateOptions()); err != nil {
			t.Errorf("the second migration: %v", err)
			return
		}
		e.migrated(js)
		ls, err := js.Stream(ctx, "DELAYD_INTAKE")
		if err != nil {
			t.Error(err)
			return
		}
		live = ls.CachedInfo().Created
		send("l-", 50)
		e.eventually("the live stream's consumer settled them", func() bool {
			c, err := js.Consumer(ctx, "DELAYD_INTAKE", "DELAYD_INTAKE")
			if err != nil {
				return false
			}
			i, err := c.Info(ctx)
			return err == nil && i.AckFloor.Stream >= 50 && i.NumAckPending == 0 && i.NumPending == 0
		})
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := e.migrate(tctx, first); err != nil {
		t.Fatalf("the first migration: %v", err)
	}
	s, err := js.Stream(ctx, "DELAYD_INTAKE")
	if err != nil || !s.CachedInfo().Created.Equal(live) {
		t.Fatalf("the live stream was deleted by the overtaken migration (now: %v)", err)
	}
	send("a-", 20)
	e.eventually("every acknowledged envelope is stored", func() bool { return st.missing(acked) == 0 })
	st.check(t, acked)
	e.migrated(js)
}

// A name too long for the stream between (<name>_MIGRATING over
// JetStream's 255 characters) is refused before any change: the work
// queue keeps the intake subjects.
func TestStreamIntakeMigrationRefusesALongName(t *testing.T) {
	e := newStreamEnv(t)
	name := strings.Repeat("N", 246)
	opt := migrateOptions()
	opt.Name, opt.WorkQueue = name, true
	if _, err := e.js().CreateStream(context.Background(), streamConfigOf(opt, name)); err != nil {
		t.Fatal(err)
	}
	opt.WorkQueue = false
	if err := e.migrate(context.Background(), opt); err == nil || !strings.Contains(err.Error(), "245") {
		t.Fatalf("migrate a name of 246: %v", err)
	}
	s, err := e.js().Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.Retention != jetstream.WorkQueuePolicy || !slices.Equal(c.Subjects, []string{"delayd.intake", "delayd.intake.>"}) {
		t.Fatalf("after the refusal: retention %v, subjects %v", c.Retention, c.Subjects)
	}
}

// A daemon whose stream a migration drained and deleted says so, at info:
// not the warning that a floor it cannot save is a risk (a deleted stream
// leaves nothing a consumer created again could store again).
func TestStreamIntakeMigrationDeletesQuietly(t *testing.T) {
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) { o.WorkQueue = true })()
	var out testutil.Buffer
	e.log = hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info})
	st := countWrites(e.st)
	e.start(st)
	js := e.js()
	p := startPublisher(t, js, "q")
	p.waitAcked(e, 100)
	if err := e.migrate(context.Background(), migrateOptions()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	p.waitAcked(e, 100)
	p.end()
	acked := p.ids()
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(out.String())
		}
	})
	e.eventually("every acknowledged envelope is stored", func() bool { return st.missing(acked) == 0 })
	st.check(t, acked)
	// The daemon tries to save the deleted stream's floor once more unless
	// it bound the new stream first, and under load that try comes late:
	// wait for what it says, a few floor rounds past a quiet machine's.
	const warned, said = "cannot save the intake stream's floor", "the intake stream is gone"
	deadline := time.Now().Add(40 * floorEvery)
	for !strings.Contains(out.String(), said) && !strings.Contains(out.String(), warned) && time.Now().Before(deadline) {
		time.Sleep(floorEvery / 5)
	}
	time.Sleep(2 * floorEvery) // a warning right after the info line
	switch {
	case strings.Contains(out.String(), warned):
		t.Fatalf("a stream the migration deleted is warned about:\n%s", out.String())
	case !strings.Contains(out.String(), said):
		// Bound the new stream before any try: nothing to say, and
		// nothing warned either.
		t.Log("the daemon bound the new stream before saving the deleted one's floor")
	}
}
