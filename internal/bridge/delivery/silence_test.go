package delivery

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/scanner"
	"github.com/delayd/delayd/internal/testutil"
)

// silentPath is a publisher whose connection reaches NATS through a fault
// proxy, with live's pings and the given probe time, and a subscriber on
// the target "t" reached directly.
func silentPath(t *testing.T, live *bridge.Liveness, probe time.Duration) (*Publisher, *testutil.Proxy) {
	t.Helper()
	n := testutil.StartNATS(t)
	proxy := testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", n.Opts.Port))
	ref := bridge.NewRefusals()
	nc, err := bridge.Connect("nats://"+proxy.Addr(), "t", bridge.Auth{}, hclog.NewNullLogger(), nil, ref, live)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	p, err := NewPublisher(nc, ref, PublisherOptions{Liveness: live, Probe: probe})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	proven(t, p)
	sub, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	if _, err := sub.Subscribe("t", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	return p, proxy
}

func oneDelivery() []envelope.Delivery {
	return []envelope.Delivery{{ID: "x", Due: time.UnixMilli(1_800_000_000_000), Attempt: 1,
		Envelope: envelope.Envelope{Target: "t", Payload: []byte("p")}}}
}

// publishWithin publishes one delivery with a deadline of d.
func publishWithin(p *Publisher, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return p.Publish(ctx, oneDelivery())[0]
}

// A flush unconfirmed at its deadline, then a probe unanswered too: the
// path is silent, the delivery counts as never sent, the publisher reports
// itself not connected (with why) until the path answers again.
func TestSilentPathFlushTimeoutIsUnreachable(t *testing.T) {
	t.Parallel()
	p, proxy := silentPath(t, nil, 200*time.Millisecond)
	if err := publishWithin(p, 5*time.Second); err != nil {
		t.Fatalf("before the fault: %v", err)
	}
	proxy.Blackhole()
	err := publishWithin(p, 300*time.Millisecond)
	if !errors.Is(err, errSilent) || !errors.Is(err, scanner.ErrUnreachable) {
		t.Fatalf("into a silent path: %v; want errSilent (unreachable, not an attempt)", err)
	}
	if p.Connected() || p.whySilent() == nil {
		t.Fatalf("connected %v, silent %v: want not connected, with the reason", p.Connected(), p.whySilent())
	}
	// A batch that comes after is not even written.
	if err := publishWithin(p, 5*time.Second); !errors.Is(err, errSilent) {
		t.Fatalf("while silent: %v", err)
	}
	proxy.Clear()
	if !testutil.Eventually(10*time.Second, p.Connected) {
		t.Fatalf("still silent 10 s after the path healed: %v", p.whySilent())
	}
	if err := publishWithin(p, 5*time.Second); err != nil {
		t.Fatalf("after the path healed: %v", err)
	}
}

// A slow path is not a silent one: a flush confirmed after its deadline,
// whose probe is answered, is an attempt (it may have been delivered), and
// the publisher stays connected.
func TestSlowPathFlushTimeoutIsAnAttempt(t *testing.T) {
	t.Parallel()
	p, proxy := silentPath(t, nil, 3*time.Second)
	proxy.Set(testutil.Down, testutil.Fault{Latency: 300 * time.Millisecond})
	err := publishWithin(p, 100*time.Millisecond)
	if err == nil || errors.Is(err, scanner.ErrUnreachable) {
		t.Fatalf("slow flush: %v; want a failure that counts as an attempt", err)
	}
	if !p.Connected() {
		t.Fatalf("a slow path counted as silent: %v", p.whySilent())
	}
}

// A connection nats.go drops for unanswered pings while a batch waits for
// its flush: the batch was sent into a silent path, not an attempt.
func TestStaleConnectionDuringFlushIsUnreachable(t *testing.T) {
	t.Parallel()
	live := &bridge.Liveness{PingInterval: 100 * time.Millisecond, MaxPingsOut: 2}
	p, proxy := silentPath(t, live, 5*time.Second)
	if err := publishWithin(p, 5*time.Second); err != nil {
		t.Fatalf("before the fault: %v", err)
	}
	proxy.Blackhole()
	err := publishWithin(p, 20*time.Second)
	if !errors.Is(err, errSilent) {
		t.Fatalf("a batch cut by a stale connection: %v; want errSilent", err)
	}
	if p.Connected() {
		t.Fatal("connected into a blackhole")
	}
}
