package bridge

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/testutil"
)

// wakeRelay is a running relay on its own connection, and the wake-ups it
// handed to its scanner.
type wakeRelay struct {
	*WakeRelay
	got chan [2]int64 // shard, due time
}

func startWakeRelay(t *testing.T, url, subject string) *wakeRelay {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	w := &wakeRelay{WakeRelay: NewWakeRelay(nc, subject, hclog.NewNullLogger()), got: make(chan [2]int64, 1024)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- w.Run(ctx, func(shard int, dueMs int64) { w.got <- [2]int64{int64(shard), dueMs} })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("wake relay: %v", err)
		}
	})
	return w
}

// ready is the wake-up the tests announce until every relay listens.
var ready = [2]int64{0, 1}

// awaitListening announces ready from w until each of the relays heard it:
// Run subscribes in its own goroutine.
func awaitListening(t *testing.T, w *wakeRelay, relays ...*wakeRelay) {
	t.Helper()
	heard := make([]bool, len(relays))
	for end := time.Now().Add(10 * time.Second); ; {
		w.Announce(int(ready[0]), ready[1])
		all := true
		for i, r := range relays {
			select {
			case <-r.got:
				heard[i] = true
			case <-time.After(20 * time.Millisecond):
			}
			all = all && heard[i]
		}
		if all {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("relays heard %v after 10s", heard)
		}
	}
}

// next is the next wake-up the relay handed on, past those of
// awaitListening, failing after 10 s.
func (w *wakeRelay) next(t *testing.T) [2]int64 {
	t.Helper()
	for {
		select {
		case g := <-w.got:
			if g != ready {
				return g
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no wake-up within 10s")
		}
	}
}

// A wake-up announced by one daemon reaches the others relaying on the
// same subject, with its shard and due time intact, on
// <subject>.internal.wake.<shard> with the due time in decimal. The
// announcer hears its own too: there is no echo suppression, and none is
// needed, since a daemon announces only for shards it does not own and
// the scanner's WakeLocal ignores those. A malformed wake-up is dropped,
// not handed on, and daemons on another subject hear nothing.
func TestWakeRelayReachesEveryDaemon(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	a, b := startWakeRelay(t, n.URL(), "delayd"), startWakeRelay(t, n.URL(), "delayd")
	other := startWakeRelay(t, n.URL(), "other")
	awaitListening(t, a, a, b)
	awaitListening(t, other, other)

	a.Announce(1023, 1_800_000_000_123)
	for name, w := range map[string]*wakeRelay{"b": b, "a itself": a} {
		if got, want := w.next(t), [2]int64{1023, 1_800_000_000_123}; got != want {
			t.Errorf("%s heard %v (shard, due), want %v", name, got, want)
		}
	}
	b.Announce(7, 42)
	for name, w := range map[string]*wakeRelay{"a": a, "b itself": b} {
		if got := w.next(t); got != [2]int64{7, 42} {
			t.Errorf("%s heard %v from b, want shard 7 due 42", name, got)
		}
	}

	// What another client sends on the wire: each malformed one before the
	// well-formed one reaches b first if it is handed on.
	probe, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	for _, m := range [][2]string{
		{"delayd.internal.wake.x", "5"},       // no shard
		{"delayd.internal.wake.3x", "5"},      // no shard
		{"delayd.internal.wake.3", "soon"},    // no due time
		{"delayd.internal.wake.3", ""},        // no due time
		{"delayd.internal.wake.3", "5"},       // well-formed
		{"other.internal.wake.9", "9"},        // for other
		{"delayd.wake.4", "4"},                // outside the internal space
		{"delayd.internal.wake.4.extra", "4"}, // deeper than a shard
	} {
		if err := probe.Publish(m[0], []byte(m[1])); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.next(t); got != [2]int64{3, 5} {
		t.Errorf("b heard %v from the wire, want shard 3 due 5 (and nothing malformed before it)", got)
	}
	if got := other.next(t); got != [2]int64{9, 9} {
		t.Errorf("other heard %v, want only its own subject's shard 9 due 9", got)
	}
	// Last, from b: whatever a relay wrongly heard came before it.
	b.Announce(8, 8)
	for r, want := range map[*wakeRelay][][2]int64{a: {{3, 5}, {8, 8}}, b: {{8, 8}}} {
		for _, w := range want {
			if got := r.next(t); got != w {
				t.Errorf("heard %v, want %v", got, w)
			}
		}
	}
}
