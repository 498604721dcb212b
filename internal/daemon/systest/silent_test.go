package systest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// TestSilentPathIsAnOutage: daemons A and B share one Redis and one NATS;
// B reaches NATS through a proxy that then blackholes its path (no byte
// passes either way, both sockets stay open). B must notice within
// seconds, give its shards up and fail /readyz with the reason; A then
// delivers every envelope of B's shards within ownership.ttl + 10 s of its
// due time, as attempt 1: the outage counts no attempt and buries nothing.
// The server runs with the ping settings docs/operations.md gives, so it
// drops B's subscriptions too, and every request is answered by A.
func TestSilentPathIsAnOutage(t *testing.T) {
	t.Parallel()
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: testutil.StartNATS(t, func(o *server.Options) {
		o.PingInterval = 500 * time.Millisecond
		o.MaxPingsOut = 2
	})}
	proxy := testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", e.NATS.Opts.Port))
	a := e.Config()
	a.Shards = 16
	a.Scanner.MaxAttempts = 3
	a.NATS.Name = "silent-a"
	b := a
	b.NATS.Name = "silent-b"
	b.NATS.URL = "nats://" + proxy.Addr()
	b.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	e.StartDaemon(a)
	e.StartDaemon(b)
	st := e.InspectStore(a)
	bShards := waitSplit(t, st, b.NATS.Name+"@")

	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "silent.t")
	const n = 160
	ids := make([]string, n)
	due := map[string]time.Time{}
	inB := 0
	start := time.Now().Add(1500 * time.Millisecond)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%d", i)
		at := start.Add(time.Duration(i) * 3 * time.Second / n)
		due[ids[i]] = at
		if bShards[st.Shard(ids[i])] {
			inB++
		}
		daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "silent.t", "Delayd-Id", ids[i], "Delayd-At", at.UTC().Format(time.RFC3339Nano)))
	}
	if inB == 0 {
		t.Fatal("no envelope in B's shards")
	}
	proxy.Blackhole()
	t.Logf("blackholed B's path; %d of %d envelopes in B's %d shards", inB, n, len(bShards))

	last := start.Add(3 * time.Second)
	got.WaitIDs(ids, time.Until(last.Add(a.Ownership.TTL+10*time.Second)))
	var worst time.Duration // the latest of B's shards
	for _, id := range ids {
		ds := got.Get(id)
		if len(ds) == 0 {
			t.Errorf("%s (shard %d, B's: %v) not delivered", id, st.Shard(id), bShards[st.Shard(id)])
			continue
		}
		late := ds[0].Received.Sub(due[id])
		if late > a.Ownership.TTL+10*time.Second {
			t.Errorf("%s delivered %s after its due time", id, late)
		}
		if bShards[st.Shard(id)] {
			worst = max(worst, late)
		}
		for _, d := range ds {
			if d.Attempt != 1 {
				t.Errorf("%s delivered with attempt %d: the outage was counted", id, d.Attempt)
			}
		}
	}
	t.Logf("the latest envelope of B's shards arrived %s after its due time", worst)
	stats, _, err := st.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if s.Counts.Dead > 0 {
			t.Errorf("shard %d: %d envelopes dead", s.Shard, s.Counts.Dead)
		}
	}

	// B says why it is not ready.
	var code int
	var body string
	if !testutil.Eventually(20*time.Second, func() bool {
		code, body = daemontest.HTTPGet(t, "http://"+b.HTTP.Addr+"/readyz")
		return code == 503 && strings.Contains(body, "NATS")
	}) {
		t.Fatalf("B still ready 20 s into the blackhole: %d %s", code, body)
	}
	t.Logf("B: %s", strings.TrimSpace(body))

	// Once the server dropped B's silent connections (its own PINGs
	// unanswered), no request is routed to B: all are answered.
	testutil.Wait(t, 20*time.Second, "the server drops B's connections in the blackhole", func() bool { return !serverHas(t, e.NATS, b.NATS.Name) })
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "silent.later", "Delayd-Delay", "1h", "Delayd-Id", fmt.Sprintf("later-%d", i)), "x")
			if err != nil || rep.Header.Get(micro.ErrorHeader) != "" {
				t.Errorf("request %d after the server dropped B: %v", i, err)
			}
		}()
	}
	wg.Wait()
}

// waitSplit waits until every shard is owned, some by the daemon whose
// owner ids start with prefix and some by another, and returns its shards.
func waitSplit(t *testing.T, st *store.Store, prefix string) map[int]bool {
	t.Helper()
	var owners []string
	var mine map[int]bool
	if !testutil.Eventually(20*time.Second, func() bool {
		var err error
		if owners, err = st.Owners(context.Background()); err != nil {
			t.Fatal(err)
		}
		var others int
		mine, others = map[int]bool{}, 0
		for sh, o := range owners {
			switch {
			case o == "":
				others = -len(owners)
			case strings.HasPrefix(o, prefix):
				mine[sh] = true
			default:
				others++
			}
		}
		return len(mine) > 0 && others > 0
	}) {
		t.Fatalf("shards not split between two daemons: %v", owners)
	}
	return mine
}

// serverHas reports whether the server still has a client connection
// whose name starts with name.
func serverHas(t *testing.T, n *testutil.NATS, name string) bool {
	t.Helper()
	cz, err := n.Srv.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Conns {
		if strings.HasPrefix(c.Name, name) {
			return true
		}
	}
	return false
}
