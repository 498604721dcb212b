package intake

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// holding refuses to store the ids it holds, as Redis down would for
// them alone: their messages stay unsettled (offered again after
// retry_delay) below settled ones, and pin the consumer's ack floor.
type holding struct {
	StreamStore
	mu   sync.Mutex
	held map[string]bool
}

func (h *holding) hold(id string) {
	h.mu.Lock()
	h.held[id] = true
	h.mu.Unlock()
}

func (h *holding) release(id string) {
	h.mu.Lock()
	delete(h.held, id)
	h.mu.Unlock()
}

func (h *holding) Schedule(ctx context.Context, items []store.Item) ([]store.Scheduled, []error) {
	due, errs := make([]store.Scheduled, len(items)), make([]error, len(items))
	var pass []store.Item
	var at []int
	h.mu.Lock()
	for i, it := range items {
		if h.held[it.ID] {
			errs[i] = fmt.Errorf("held: %w", store.ErrNotWritten)
			continue
		}
		pass, at = append(pass, it), append(at, i)
	}
	h.mu.Unlock()
	if len(pass) > 0 {
		d, e := h.StreamStore.Schedule(ctx, pass)
		for j, i := range at {
			due[i], errs[i] = d[j], e[j]
		}
	}
	return due, errs
}

// stepDown asks the leader of the intake stream (consumer == "") or of its
// consumer to step down, and waits until another node leads it.
func stepDown(t *testing.T, nc *nats.Conn, js jetstream.JetStream, consumer string) {
	t.Helper()
	ctx := context.Background()
	leader := func() string {
		if consumer == "" {
			s, err := js.Stream(ctx, "DELAYD_INTAKE")
			if err != nil || s.CachedInfo().Cluster == nil {
				return ""
			}
			return s.CachedInfo().Cluster.Leader
		}
		c, err := js.Consumer(ctx, "DELAYD_INTAKE", consumer)
		if err != nil || c.CachedInfo().Cluster == nil {
			return ""
		}
		return c.CachedInfo().Cluster.Leader
	}
	var was string
	for deadline := time.Now().Add(20 * time.Second); was == ""; time.Sleep(20 * time.Millisecond) {
		if was = leader(); was == "" && time.Now().After(deadline) {
			t.Fatal("no leader")
		}
	}
	subject := "$JS.API.STREAM.LEADER.STEPDOWN.DELAYD_INTAKE"
	if consumer != "" {
		subject = "$JS.API.CONSUMER.LEADER.STEPDOWN.DELAYD_INTAKE." + consumer
	}
	m, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Success bool `json:"success"`
		Error   any  `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil || !r.Success {
		t.Fatalf("step down %s: %s", subject, m.Data)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if now := leader(); now != "" && now != was {
			t.Logf("%s: leader %s, was %s", strings.TrimPrefix(subject, "$JS.API."), now, was)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s still leads", subject, was)
		}
	}
}

// newClusterStreamEnv is a streamEnv on a 3-node NATS cluster; urls(i)
// lists the nodes' URLs from node i on.
func newClusterStreamEnv(t *testing.T) (*streamEnv, []*testutil.NATS, func(int) string) {
	t.Helper()
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("a 3-node NATS cluster")
	}
	nodes := testutil.StartNATSCluster(t, 3)
	urls := func(first int) string {
		var u []string
		for i := range nodes {
			u = append(u, nodes[(first+i)%len(nodes)].URL())
		}
		return strings.Join(u, ",")
	}
	e := &streamEnv{t: t, nats: nodes[0], redis: testutil.StartRedis(t), obs: &streamCounts{n: map[string]int{}}}
	e.url = urls(0)
	e.st = store.New(store.NewClient(store.Options{Addrs: []string{e.redis.Addr}}), "streamtest", 4)
	t.Cleanup(func() { e.st.Close() })
	return e, nodes, urls
}

// On a 3-node NATS cluster, an R3 intake stream of the limits layout
// (purged below the consumer's ack floor) goes through a leader change of
// the stream and of its consumer, with two daemons on different nodes,
// publishers steady, and messages held unsettled below settled ones
// across the change. Every envelope a PubAck confirmed is stored exactly
// once; the purges go on on the new leaders and never take a message
// that is not settled: each held one is still in the stream until it is
// stored.
func TestStreamIntakeClusterLeaderChange(t *testing.T) {
	e, nodes, urls := newClusterStreamEnv(t)
	st := countWrites(e.st)
	h := &holding{StreamStore: st, held: map[string]bool{}}
	for i := 1; i <= 2; i++ { // the daemons on n1 and n2, publishers on n0
		e.url = urls(i)
		e.start(h, func(o *StreamOptions) { o.Replicas, o.AckWait = 3, 2*time.Second })
	}
	nc, err := nats.Connect(urls(0), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := js.Stream(ctx, "DELAYD_INTAKE")
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.Replicas != 3 || !limitsLayout(s.CachedInfo()) {
		t.Fatalf("stream: %d replicas, retention %v, metadata %v", c.Replicas, c.Retention, c.Metadata)
	}

	var mu sync.Mutex
	var acked []string
	heldSeq := map[string]uint64{}
	pub := func(id string) {
		m := &nats.Msg{Subject: "delayd.intake", Data: []byte("x"), Header: hdr(envelope.HeaderTarget, "orders.cancel",
			envelope.HeaderDelay, "1h", envelope.HeaderID, id)}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ack, err := js.PublishMsg(pctx, m, jetstream.WithRetryAttempts(50), jetstream.WithRetryWait(50*time.Millisecond))
		if err != nil {
			t.Logf("publish %s: %v", id, err)
			return // not acknowledged: no promise to keep
		}
		mu.Lock()
		defer mu.Unlock()
		acked = append(acked, id)
		if strings.HasPrefix(id, "hold-") {
			heldSeq[id] = ack.Sequence
		}
	}
	// batch publishes ids from..from+n-1, 16 at a time; every holdEvery-th
	// counted from from is held.
	batch := func(from, n, holdEvery int) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i := from; i < from+n; i++ {
			id := fmt.Sprint("c-", i)
			if holdEvery > 0 && (i-from)%holdEvery == holdEvery-1 {
				id = fmt.Sprint("hold-", i)
				h.hold(id)
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				pub(id)
			}()
		}
		wg.Wait()
	}
	first := func() uint64 {
		info, err := s.Info(ctx)
		if err != nil {
			return 0
		}
		return info.State.FirstSeq
	}
	// stillThere fails the test for a held message the stream lost.
	stillThere := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			mu.Lock()
			seq, ok := heldSeq[id]
			mu.Unlock()
			if !ok {
				continue // its publish was not acknowledged
			}
			if _, err := s.GetMsg(ctx, seq); err != nil {
				t.Fatalf("%s (sequence %d), not yet stored, is gone from the stream (first sequence %d): %v", id, seq, first(), err)
			}
		}
	}

	bg := startPublisher(t, js, "bg") // steady publishing throughout
	batch(0, 100, 0)
	batch(100, 200, 40) // holds 139, 179, 219, 259, 299
	mu.Lock()
	floor := heldSeq["hold-139"]
	mu.Unlock()
	if floor == 0 {
		t.Fatal("hold-139 not acknowledged")
	}
	e.eventually("purged up to the first held message", func() bool { return first() >= floor })
	stillThere("hold-139", "hold-179", "hold-219", "hold-259", "hold-299")

	stepDown(t, nc, js, "")
	stepDown(t, nc, js, "DELAYD_INTAKE")
	batch(300, 200, 0)
	stillThere("hold-139", "hold-179", "hold-219", "hold-259", "hold-299")
	// The floor moves on the new leaders: purged up to the next held one.
	h.release("hold-139")
	mu.Lock()
	floor = heldSeq["hold-179"]
	mu.Unlock()
	e.eventually("purged up to the next held message", func() bool { return first() >= floor })
	stillThere("hold-179", "hold-219", "hold-259", "hold-299")

	stepDown(t, nc, js, "")
	stillThere("hold-179", "hold-219", "hold-259", "hold-299")
	// The stream's leader killed, publishing on: what it had not
	// replicated is lost with it (a publish it did not acknowledge).
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		t.Fatalf("stream info: %v", err)
	}
	var killed *testutil.NATS
	for _, n := range nodes {
		if n.Opts.ServerName == info.Cluster.Leader {
			killed = n
		}
	}
	killed.Stop()
	t.Logf("stopped the stream's leader %s", info.Cluster.Leader)
	batch(500, 100, 0)
	killed.Start()
	stillThere("hold-179", "hold-219", "hold-259", "hold-299")
	for _, id := range []string{"hold-179", "hold-219", "hold-259", "hold-299"} {
		h.release(id)
	}
	bg.waitAcked(e, 100)
	bg.end()
	mu.Lock()
	all := append(acked, bg.ids()...)
	mu.Unlock()
	e.eventually("every acknowledged envelope is stored", func() bool { return st.missing(all) == 0 })
	st.check(t, all)
	e.eventually("the stream is purged empty", func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
}

// On a 3-node NATS cluster, an R3 work-queue intake stream is migrated to
// the limits layout while two daemons on different nodes take from it and
// publishers go on: every envelope a PubAck confirmed is stored exactly
// once. (Replication is where a message the old leader took just before
// the subjects moved could be stored after them: the barrier is behind
// it.)
func TestStreamIntakeClusterMigration(t *testing.T) {
	e, _, urls := newClusterStreamEnv(t)
	r3 := func(o *StreamOptions) { o.Replicas, o.AckWait = 3, 2*time.Second }
	e.start(e.st, r3, func(o *StreamOptions) { o.WorkQueue = true })()
	st := countWrites(e.st)
	for i := 1; i <= 2; i++ {
		e.url = urls(i)
		e.start(st, r3)
	}
	nc, err := nats.Connect(urls(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	p := startPublisher(t, js, "cm")
	p.waitAcked(e, 200)
	opt := migrateOptions()
	opt.Replicas = 3
	e.url = urls(2)
	if err := e.migrate(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	p.waitAcked(e, 200)
	p.end()
	acked := p.ids()
	e.eventually("every acknowledged envelope is stored", func() bool { return st.missing(acked) == 0 })
	st.check(t, acked)
	e.migrated(js)
	s, err := js.Stream(context.Background(), "DELAYD_INTAKE")
	if err != nil || s.CachedInfo().Config.Replicas != 3 {
		t.Fatalf("migrated stream: %v %+v", err, s.CachedInfo().Config)
	}
}
