package delivery

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/scanner"
	"github.com/delayd/delayd/internal/testutil"
)

// streamMsgs is how many messages the stream holds once it has processed
// everything published before: its state after a flush of a request.
func streamMsgs(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// A core target captured by a stream that refuses the message (full with
// discard new, over its byte limit, a message larger than its limit, a
// sealed stream) answers on the delivery's reply subject with a JetStream
// error: the delivery fails with the stream's reason, and is never counted
// delivered. The stream's answer comes from its own goroutine, after the
// flush's PONG; the very first delivery to each target is in the test, so
// nothing learned from an earlier answer helps.
func TestStreamRefusalFailsDelivery(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc := daemonConn(t, n)
	js := jsOf(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	streams := map[string]jetstream.Stream{}
	for _, sc := range []jetstream.StreamConfig{
		{Name: "MSGS", Subjects: []string{"msgs.>"}, MaxMsgs: 2, Discard: jetstream.DiscardNew},
		{Name: "BYTES", Subjects: []string{"bytes.*"}, MaxBytes: 300, Discard: jetstream.DiscardNew},
		{Name: "SIZE", Subjects: []string{"size.x"}, MaxMsgSize: 16},
		{Name: "SEALED", Subjects: []string{"sealed.>"}},
		{Name: "OK", Subjects: []string{"ok.>"}},
	} {
		s, err := js.CreateStream(ctx, sc)
		if err != nil {
			t.Fatal(err)
		}
		streams[sc.Name] = s
	}
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "SEALED", Subjects: []string{"sealed.>"}, Sealed: true}); err != nil {
		t.Fatal(err)
	}
	consumer, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	if _, err := consumer.Subscribe("heard.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	_ = consumer.Flush()

	p, err := NewPublisher(nc, bridge.NewRefusals(), PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	proven(t, p)
	targets := []string{"msgs.a", "ok.a", "msgs.b", "heard.a", "msgs.a", "size.x", "msgs.c", "sealed.a",
		"nobody.a", "ok.b", "bytes.a", "bytes.a", "bytes.a", "bytes.a", "bytes.a"}
	ds := deliveries(targets...)
	for i := range ds {
		ds[i].Payload = []byte("a payload of some 40 bytes, give or take")
	}
	errs := p.Publish(ctx, ds)
	refusedBy := map[string]string{"size.x": "message size exceeds maximum", "sealed.a": "sealed"}
	stored := map[string]int{}
	for i, err := range errs {
		target := targets[i]
		switch {
		case target == "nobody.a":
			if !errors.Is(err, scanner.ErrNoInterest) {
				t.Errorf("%s (#%d): got %v, want no interest", target, i, err)
			}
		case target == "heard.a" || strings.HasPrefix(target, "ok."):
			if err != nil {
				t.Errorf("%s (#%d): got %v, want delivered", target, i, err)
			} else if target != "heard.a" {
				stored["OK"]++
			}
		case refusedBy[target] != "":
			if err == nil || !strings.Contains(err.Error(), refusedBy[target]) || errors.Is(err, scanner.ErrNoInterest) {
				t.Errorf("%s (#%d): got %v, want a refusal saying %q", target, i, err, refusedBy[target])
			}
		default: // msgs.*, bytes.*: the first ones stored, the rest refused
			stream := strings.ToUpper(strings.Split(target, ".")[0])
			if err == nil {
				stored[stream]++
			} else if !strings.Contains(err.Error(), "exceeded") || !strings.Contains(err.Error(), stream) {
				t.Errorf("%s (#%d): got %v, want the stream %s's limit", target, i, err, stream)
			}
		}
	}
	for name, s := range streams {
		if got, want := streamMsgs(t, s), uint64(stored[name]); got != want {
			t.Errorf("stream %s holds %d messages, %d deliveries to it counted delivered", name, got, want)
		}
	}
	if stored["MSGS"] != 2 {
		t.Errorf("%d deliveries to MSGS (max 2) counted delivered", stored["MSGS"])
	}
	if stored["BYTES"] == 0 || stored["BYTES"] == 5 {
		t.Errorf("%d of 5 deliveries to BYTES (300 bytes) counted delivered", stored["BYTES"])
	}
	if stored["OK"] != 2 {
		t.Errorf("%d of 2 deliveries to OK counted delivered", stored["OK"])
	}

	// Batch after batch, one delivery each: the stream full, each refused.
	for range 5 {
		if err := p.Publish(ctx, deliveries("msgs.z"))[0]; err == nil || !strings.Contains(err.Error(), "maximum messages exceeded") {
			t.Fatalf("a delivery to the full stream: %v", err)
		}
	}
}

// A consumer that sees its own deliveries' reply subjects cannot fail
// anyone else's: it publishes no-responders statuses (and JetStream
// errors) to the subjects it can guess from its own, the way the old
// reply subjects (<inbox>.<batch counter>.<index>) made possible, while
// batches for it and for a victim publish concurrently. Every delivery to
// the victim, who listens the whole time, succeeds.
func TestForgedStatusesChangeNothing(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc := daemonConn(t, n)
	p, err := NewPublisher(nc, bridge.NewRefusals(), PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	proven(t, p)
	victim, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	if _, err := victim.Subscribe("victim.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	_ = victim.Flush()
	attacker, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer attacker.Close()
	var forged atomic.Int64
	forge := func(subject string, jsErr bool) {
		m := nats.NewMsg(subject)
		if jsErr {
			m.Data = []byte(`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"X","seq":0}`)
		} else {
			m.Header.Set("Status", "503")
		}
		_ = attacker.PublishMsg(m)
		forged.Add(1)
	}
	if _, err := attacker.Subscribe("attacker.>", func(m *nats.Msg) {
		tokens := strings.Split(m.Reply, ".")
		if len(tokens) < 3 {
			return
		}
		// The old layout: <inbox>.<batch>.<index>. The next batches' and
		// this batch's other deliveries.
		inbox := strings.Join(tokens[:len(tokens)-2], ".")
		if b, err := strconv.ParseUint(tokens[len(tokens)-2], 36, 64); err == nil {
			for k := uint64(0); k <= 3; k++ {
				for j := range 8 {
					forge(inbox+"."+strconv.FormatUint(b+k, 36)+"."+strconv.FormatUint(uint64(j), 36), k == 0)
				}
			}
		}
		// Any layout: every other last token, and every token of the
		// subject in turn replaced by the ones around it.
		prefix := strings.Join(tokens[:len(tokens)-1], ".")
		for j := range 8 {
			forge(prefix+"."+strconv.Itoa(j), j%2 == 0)
		}
		for i := len(tokens) - 3; i < len(tokens); i++ {
			for _, guess := range []string{"0", "1", "2", "a", tokens[i] + "0"} {
				c := append([]string(nil), tokens...)
				c[i] = guess
				forge(strings.Join(c, "."), i%2 == 0)
			}
		}
		forge(m.Reply, false) // its own: its business
		_ = attacker.Flush()
	}); err != nil {
		t.Fatal(err)
	}
	_ = attacker.Flush()

	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 150 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				targets := []string{"attacker.x", "victim.a", "victim.b", "victim.c"}
				if w%2 == 1 {
					targets = []string{"victim.a", "victim.b", "victim.c", "victim.d", "victim.e", "victim.f"}
				}
				errs := p.Publish(ctx, deliveries(targets...))
				cancel()
				for i, err := range errs {
					if strings.HasPrefix(targets[i], "victim.") && err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					}
				}
			}
		}()
	}
	wg.Wait()
	if forged.Load() == 0 {
		t.Fatal("the attacker forged nothing: the test proves nothing")
	}
	if f := failed.Load(); f > 0 {
		t.Errorf("%d deliveries to a listening victim failed (%d statuses forged), e.g. %v", f, forged.Load(), firstErr.Load())
	}
}

// A stream created after the publisher started is found before a
// delivery to it is confirmed: the list of streams is read again when a
// stream answers a delivery it did not expect, and within its refresh
// interval in any case.
func TestStreamRefusalNewStream(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc := daemonConn(t, n)
	js := jsOf(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	consumer, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	if _, err := consumer.Subscribe("late.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	_ = consumer.Flush()
	p, err := NewPublisher(nc, bridge.NewRefusals(), PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	proven(t, p)
	if err := p.Publish(ctx, deliveries("late.a"))[0]; err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LATE", Subjects: []string{"late.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew})
	if err != nil {
		t.Fatal(err)
	}
	p.streams.expire() // as after the refresh interval
	ok := 0
	for i := range 10 {
		if p.Publish(ctx, deliveries("late.a"))[0] == nil {
			ok++
		}
		if i == 0 {
			// The first one's answer comes after its flush: a delivery
			// sent before it was heard cannot know of the stream, unless
			// the list read it began is in.
			testutil.Wait(t, 5*time.Second, "the stream's answer heard or the stream listed", func() bool {
				p.streams.mu.Lock()
				defer p.streams.mu.Unlock()
				_, unlisted := p.streams.unlisted["late.a"]
				_, learned := p.streams.learned["late.a"]
				return unlisted || learned || p.streams.names["LATE"]
			})
		}
	}
	if got := streamMsgs(t, s); ok != 1 || got != 1 {
		t.Errorf("%d deliveries counted delivered, the stream holds %d", ok, got)
	}
}

// A JetStream target's delivery is confirmed by its PubAck: an error
// PubAck (a stream full with discard new) or none at all (no stream
// captures the subject: the server's no-responders status) fails the
// delivery, and only that one, so it is retried and never counted
// delivered.
func TestJetStreamTargetErrorPubAckFails(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc := daemonConn(t, n)
	js := jsOf(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, sc := range []jetstream.StreamConfig{
		{Name: "FULL", Subjects: []string{"js.full"}, MaxMsgs: 1, Discard: jetstream.DiscardNew},
		{Name: "OK", Subjects: []string{"js.ok"}},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	p, err := NewPublisher(nc, bridge.NewRefusals(), PublisherOptions{JetStream: []string{"js.>"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	proven(t, p)
	targets := []string{"js.ok", "js.full", "js.full", "js.none", "js.ok"}
	errs := p.Publish(ctx, deliveries(targets...))
	for i, err := range errs {
		wantFail := i == 2 || i == 3 // the second to the full stream; the one no stream captures
		if (err != nil) != wantFail {
			t.Errorf("%s (#%d): got %v, want failed: %v", targets[i], i, err, wantFail)
		}
	}
}

// daemonConn is a connection made as the daemon makes its own (bridge.Connect),
// closed when the test ends.
func daemonConn(t *testing.T, n *testutil.NATS) *nats.Conn {
	t.Helper()
	nc, err := bridge.Connect(n.URL(), "t", bridge.Auth{}, hclog.NewNullLogger(), nil, bridge.NewRefusals(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// jsOf is JetStream on nc.
func jsOf(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
