package delivery

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/testutil"
)

// TestOwnIntakeStreamProbesNothing: delayd's own intake stream, the one
// stream of most accounts, does not make every first delivery to a new
// subject wait for a stream's answer (100 ms each); a target it captures
// is still awaited, and a stream of the user's does make unknown targets
// probed (a subject mapping may lead into it).
func TestOwnIntakeStreamProbesNothing(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DELAYD_INTAKE", Subjects: []string{"delayd.intake", "delayd.intake.>"}}); err != nil {
		t.Fatal(err)
	}
	c := newCaptors(js, bridge.NewRefusals(), hclog.NewNullLogger(), "DELAYD_INTAKE")
	c.ready(ctx)
	if await, probe := c.captured("orders.new"); await || probe {
		t.Errorf("with only delayd's intake stream, a new target: await %v probe %v, want neither", await, probe)
	}
	if await, _ := c.captured("delayd.intake.x"); !await {
		t.Error("a target the intake stream captures is not awaited")
	}

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.y"}}); err != nil {
		t.Fatal(err)
	}
	c = newCaptors(js, bridge.NewRefusals(), hclog.NewNullLogger(), "DELAYD_INTAKE")
	c.ready(ctx)
	if _, probe := c.captured("other.z"); !probe {
		t.Error("with a stream of the user's, a target no stream lists is not probed")
	}
}

// TestCoreOnlyNATSProbesNothing: on a NATS without JetStream no stream can
// answer a delivery, so no first delivery to a target waits answerWindow for
// one. The stream list's request gets no responders there, which must read
// as "no streams", not as "cannot list them" (that made every batch to a
// new target a probe: p99 at 20k due/s went from 9 to 122 ms).
func TestCoreOnlyNATSProbesNothing(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t, func(o *server.Options) { o.JetStream = false })
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := newCaptors(js, bridge.NewRefusals(), hclog.NewNullLogger(), "DELAYD_INTAKE")
	c.ready(ctx)
	if await, probe := c.captured("orders.new"); await || probe {
		t.Errorf("on a core-only NATS, a new target: await %v probe %v, want neither", await, probe)
	}
	c.mu.Lock()
	failing := c.failing
	c.mu.Unlock()
	if failing != nil {
		t.Errorf("on a core-only NATS the stream list failed (%v): it is empty", failing)
	}
}

// captured reports whether a delivery to target waits for a stream's
// answer, failing without one (await), or is a probe (waitFor).
func (c *captors) captured(target string) (await, probe bool) {
	w := c.waitFor(target)
	return w == waitLearned || w == waitListed, w == waitProbe
}

// expire makes the next ready read the list again, and wait for it.
func (c *captors) expire() {
	c.mu.Lock()
	c.listed = time.Time{}
	c.mu.Unlock()
}

// TestFirstListReadHoldsEveryCaller: until the first list read is in, every
// delivery waits for it, not only the one that began it. A second batch
// that went on without it would take a target a stream captures for a core
// one, and count that stream's refusal as delivered.
func TestFirstListReadHoldsEveryCaller(t *testing.T) {
	t.Parallel()
	// A slow JetStream API: the list answers after 300 ms.
	c := listedBy(t, func(m *nats.Msg) {
		time.Sleep(300 * time.Millisecond)
		_ = m.Respond([]byte(noStreams))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := make(chan struct{})
	go func() {
		c.ready(ctx)
		close(first)
	}()
	for {
		c.mu.Lock()
		began := c.running != nil
		c.mu.Unlock()
		if began {
			break
		}
		runtime.Gosched()
	}
	c.ready(ctx) // a second batch while the first read is on its way
	c.mu.Lock()
	in := c.names != nil
	c.mu.Unlock()
	if !in {
		t.Error("a second caller went on before the first list read was in")
	}
	<-first
}

// TestUnlistedAnswerWaitsForItsRead: once a stream the list does not name
// answered a delivery to a target, later deliveries to it wait as probes
// until the list read that answer asked for is in; then the list decides.
// Without the wait, every delivery in between to a stream created since
// (discard new, full) counted as delivered what it refused.
func TestUnlistedAnswerWaitsForItsRead(t *testing.T) {
	t.Parallel()
	var slow atomic.Bool
	c := listedBy(t, func(m *nats.Msg) {
		if !slow.Load() {
			_ = m.Respond([]byte(noStreams))
			return
		}
		time.Sleep(300 * time.Millisecond)
		_ = m.Respond([]byte(`{"type":"io.nats.jetstream.api.v1.stream_list_response","total":1,"offset":0,"limit":256,` +
			`"streams":[{"config":{"name":"NEW","subjects":["new.>"],"retention":"limits","storage":"file","num_replicas":1},` +
			`"created":"2026-12-05T00:00:00Z","state":{"messages":0}}]}`))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.ready(ctx)
	if w := c.waitFor("new.a"); w != noWait {
		t.Fatalf("no stream listed: wait %d, want none", w)
	}
	slow.Store(true)
	c.heard("new.a", stored, "", "NEW", true) // a stream created since answered
	if w := c.waitFor("new.a"); w != waitProbe {
		t.Errorf("while the list read it asked for runs: wait %d, want a probe's", w)
	}
	if w := c.waitFor("other.b"); w != noWait {
		t.Errorf("another target meanwhile: wait %d, want none", w)
	}
	testutil.Wait(t, 5*time.Second, "the list read is in", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.running == nil
	})
	if w := c.waitFor("new.a"); w != waitListed {
		t.Errorf("once listed: wait %d, want a listed stream's", w)
	}
}

// listedBy returns captors whose stream list is answered by answer, on a
// core NATS (no JetStream): a stand-in for a slow or changing JetStream API.
func listedBy(t *testing.T, answer func(m *nats.Msg)) *captors {
	t.Helper()
	n := testutil.StartNATS(t, func(o *server.Options) { o.JetStream = false })
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.Subscribe(streamList, answer); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return newCaptors(js, bridge.NewRefusals(), hclog.NewNullLogger(), "DELAYD_INTAKE")
}

// noStreams is a stream list answer that lists none.
const noStreams = `{"type":"io.nats.jetstream.api.v1.stream_list_response","total":0,"offset":0,"limit":256,"streams":[]}`
