package delivery

import (
	"context"
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
