package scanner

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// Ready must fail with a reason while this daemon cannot renew its shard
// leases: due envelopes would wait for nobody, yet probes said ready.
func TestOwnershipReadyFollowsLeases(t *testing.T) {
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "t", 4)
	defer st.Close()
	sc := New(st, nil, nil, Options{Shared: true, IdleInterval: time.Second}, hclog.NewNullLogger())
	const ttl = 300 * time.Millisecond
	own := NewOwnership(st, sc, "a", ttl, hclog.NewNullLogger())
	ctx := context.Background()
	if err := own.Ready(ctx); err == nil {
		t.Fatal("ready before any ownership round")
	}
	own.round(ctx)
	if err := own.Ready(ctx); err != nil {
		t.Fatalf("after a good round: %v", err)
	}
	if n := len(sc.Owned()); n != 4 {
		t.Fatalf("a lone daemon owns %d of 4 shards", n)
	}
	r.Kill()
	own.round(ctx)
	time.Sleep(ttl + 50*time.Millisecond)
	own.round(ctx)
	err := own.Ready(ctx)
	if err == nil || !strings.Contains(err.Error(), "not renewed") {
		t.Fatalf("Redis gone for longer than the lease: want not ready, got %v", err)
	}
	r.Start()
	own.round(ctx)
	if err := own.Ready(ctx); err != nil {
		t.Fatalf("after Redis came back: %v", err)
	}
}
