package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

type lockedBuffer = testutil.Buffer

// TestWaitReadyKeepsSayingRedisIsUnreachable: with a wrong Redis address
// the daemon says so again and again, with the address and the key to
// fix, instead of one warning and then silence (a newcomer waited 20 s
// for anything to happen).
func TestWaitReadyKeepsSayingRedisIsUnreachable(t *testing.T) {
	saved := stillUnreachable
	stillUnreachable = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}
	defer func() { stillUnreachable = saved }()

	// Nothing listens there; the address carries a password, which no
	// log line may show.
	hostport := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	addr := "redis://:pwSECRET@" + hostport
	second := fmt.Sprintf("redis://u:pw2SECRET@127.0.0.1:%d", testutil.FreePort(t))
	st := store.New(store.NewClient(store.Options{Addrs: []string{hostport}}), "t", 4)
	defer st.Close()
	var out lockedBuffer
	log := hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info})
	ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
	defer cancel()
	waitReady(ctx, st, []string{addr, second}, func() error { return nil }, log)

	logs := out.String()
	if n := strings.Count(logs, "Redis still not reachable"); n < 2 {
		t.Fatalf("%d reminders in 800 ms with reminders at 100 and 200 ms, want at least 2:\n%s", n, logs)
	}
	if strings.Contains(logs, "SECRET") {
		t.Errorf("the password of the address is in the log:\n%s", logs)
	}
	if !strings.Contains(logs, hostport) || !strings.Contains(logs, "--redis-addrs") {
		t.Errorf("the reminders must name the address and how to change it:\n%s", logs)
	}
	if strings.Contains(logs, "delayd: ready") || strings.Contains(logs, "[INFO]  ready") {
		t.Errorf("ready logged without Redis:\n%s", logs)
	}

	// Once it answers: said, then ready.
	r := testutil.StartRedis(t)
	st2 := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "t", 4)
	defer st2.Close()
	out.Reset()
	waitReady(context.Background(), st2, []string{r.Addr}, func() error { return nil }, log)
	if !strings.Contains(out.String(), "ready") || strings.Contains(out.String(), "not reachable") {
		t.Errorf("a reachable Redis: %s", out.String())
	}
}

// TestWaitReadyKeepsSayingNATSIsUnreachable: with NATS down at start the
// daemon says so again on the same schedule as Redis, with the reason and
// the key to fix; before, nothing after the first lines said it.
func TestWaitReadyKeepsSayingNATSIsUnreachable(t *testing.T) {
	saved := stillUnreachable
	stillUnreachable = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}
	defer func() { stillUnreachable = saved }()
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "t", 4)
	defer st.Close()
	var out lockedBuffer
	log := hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info})
	ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
	defer cancel()
	down := errors.New("the NATS delivery connection is down (last disconnect: nats: Authorization Violation)")
	waitReady(ctx, st, []string{r.Addr}, func() error { return down }, log)
	logs := out.String()
	if n := strings.Count(logs, "NATS still not reachable"); n < 2 {
		t.Fatalf("%d reminders in 800 ms with reminders at 100 and 200 ms, want at least 2:\n%s", n, logs)
	}
	if !strings.Contains(logs, "--nats-url") || !strings.Contains(logs, "Authorization Violation") {
		t.Errorf("the reminders must name the reason and how to change the address:\n%s", logs)
	}
	if strings.Contains(logs, "ready") {
		t.Errorf("ready logged without NATS:\n%s", logs)
	}
}

// TestWaitReadyRefusesRetiredFormats: a daemon that found Redis
// unreachable at start checks the stored format once Redis answers, and
// stops on data of a retired format, naming delayd migrate, without
// logging ready or running a script on it (the store's gate).
func TestWaitReadyRefusesRetiredFormats(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	rc := r.Client()
	ctx := context.Background()
	// A lease score of format 2 (the expiry ms plus a fraction).
	rc.HSet(ctx, "{t:0}:data", "x", "\xf0\x00\x00\x00\x00\x00\x01\x01\x03x.y\x00p")
	rc.ZAdd(ctx, "{t:0}:inflight", redis.Z{Score: 1.7e12 + 0.5, Member: "x"})
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "t", 4, store.WithSchemaGate())
	defer st.Close()
	var out lockedBuffer
	log := hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info})
	err := waitReady(ctx, st, []string{r.Addr}, func() error { return nil }, log)
	if !errors.Is(err, store.ErrMigrate) || !strings.Contains(err.Error(), "delayd migrate") {
		t.Fatalf("waitReady on format 2's lease: %v, want store.ErrMigrate naming delayd migrate", err)
	}
	if strings.Contains(out.String(), "ready") {
		t.Errorf("ready logged on a refused namespace:\n%s", out.String())
	}
	if _, err := st.Claim(ctx, []int{0}, store.ClaimOptions{Batch: 1, Lease: time.Minute}); !errors.Is(err, store.ErrNotWritten) {
		t.Fatalf("a claim on the refused namespace: %v, want ErrNotWritten", err)
	}
}
