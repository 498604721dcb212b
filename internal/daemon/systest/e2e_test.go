package systest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/daemon/daemontest"
)

func TestOrderScenario(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "orders.cancel")

	// Delivered after 1 s with the payload and headers unchanged.
	payload := "order 42 \x00\xff binary-safe"
	start := time.Now()
	rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "orders.cancel", "Delayd-Delay", "1s",
		"Delayd-Id", "order-42", "traceparent", "00-abc-def-01", "X-Multi", "a", "X-Multi", "b"), payload)
	if err != nil || rep.Header.Get(micro.ErrorHeader) != "" {
		t.Fatalf("schedule: %v %v", err, rep.Header)
	}
	var sr client.Scheduled
	if err := json.Unmarshal(rep.Data, &sr); err != nil || sr.ID != "order-42" {
		t.Fatalf("reply %q: %v", rep.Data, err)
	}
	// Paid: cancel before it is due.
	if _, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "orders.cancel", "Delayd-Delay", "1s", "Delayd-Id", "order-43"), "x"); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("delayd.cancel")
	m.Header.Set("Delayd-Id", "order-43")
	crep, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil || string(crep.Data) != `{"id":"order-43","cancelled":true}` {
		t.Fatalf("cancel: %v %q", err, crep.Data)
	}
	// Same id twice: delivered once, newer payload and time.
	_, _ = daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "orders.cancel", "Delayd-Delay", "500ms", "Delayd-Id", "order-44"), "old")
	_, _ = daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "orders.cancel", "Delayd-Delay", "1200ms", "Delayd-Id", "order-44"), "new")

	s.WaitCount(2, 5*time.Second)
	daemontest.Quiet(t, e, c, s) // nothing stored or in flight: nothing else can come

	got := s.Get("order-42")
	if len(got) != 1 {
		t.Fatalf("order-42 delivered %d times", len(got))
	}
	d := got[0]
	if d.Data != payload {
		t.Errorf("payload changed: %q", d.Data)
	}
	if d.Header.Get("traceparent") != "00-abc-def-01" || !slices.Equal(d.Header.Values("X-Multi"), []string{"a", "b"}) {
		t.Errorf("headers not passed through: %v", d.Header)
	}
	if d.Header.Get("Delayd-Target") != "" || d.Header.Get("Delayd-Delay") != "" || d.Attempt != 1 {
		t.Errorf("control headers leaked or wrong attempt: %v", d.Header)
	}
	if d.Received.Sub(start) < time.Second {
		t.Errorf("delivered after %s, before the 1 s delay", d.Received.Sub(start))
	}
	if n := len(s.Get("order-43")); n != 0 {
		t.Errorf("cancelled envelope delivered %d times", n)
	}
	o44 := s.Get("order-44")
	if len(o44) != 1 || o44[0].Data != "new" || o44[0].Received.Sub(start) < 1200*time.Millisecond {
		t.Errorf("replaced envelope: %+v", o44)
	}
	t.Logf("order-42 lateness %s", d.Received.Sub(d.Due))
}

func TestPlainPublishIsStored(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	e.StartDaemon(e.Config())
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "plain.target")
	m := &nats.Msg{Subject: "delayd.schedule", Header: daemontest.Hdr("Delayd-Target", "plain.target", "Delayd-Delay", "100ms", "Delayd-Id", "p1"), Data: []byte("fire and forget")}
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	if s.WaitCount(1, 5*time.Second) != 1 || s.Get("p1")[0].Data != "fire and forget" {
		t.Fatal("plain publish not delivered")
	}
}

// longLease is the claim lease of the tests that count duplicates without
// a fault: a batch claimed while a busy 2-core machine starves the daemon
// for more than the harness's 2 s lease is claimed again and delivered
// twice, as it should be, but that is a fault those tests do not mean to
// count. (TestNeverEarly once saw 44 duplicates of 2,000 at a load
// average of 15, lateness p99 1.3 s; Sink.Check now logs their attempts.)
const longLease = 10 * time.Second

func TestNeverEarly(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.Lease = longLease
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "early.check")
	const n = 2000
	ids := daemontest.ScheduleMany(t, nc, n, 16, "e", func(i int, h nats.Header) {
		h.Set("Delayd-Target", "early.check")
		if i%2 == 0 {
			h.Set("Delayd-Delay", fmt.Sprintf("%dms", 200+i%1000))
		} else {
			h.Set("Delayd-At", time.Now().Add(time.Duration(200+i%1000)*time.Millisecond).UTC().Format(time.RFC3339Nano))
		}
	})
	s.WaitCount(n, 10*time.Second)
	lateness, dups := s.Check(t, ids)
	if dups != 0 {
		t.Errorf("%d duplicates without any fault", dups)
	}
	logLateness(t, lateness)
}

func logLateness(t *testing.T, l []time.Duration) {
	t.Helper()
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	q := func(p float64) time.Duration { return l[min(len(l)-1, int(p*float64(len(l))))] }
	t.Logf("lateness over %d deliveries: p50=%s p90=%s p99=%s max=%s", len(l), q(0.5), q(0.9), q(0.99), l[len(l)-1])
}

func TestRestartKeepsPending(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	stop := e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "restart.target")
	var ids []string
	for i := range 50 {
		id := "r" + strconv.Itoa(i)
		ids = append(ids, id)
		if _, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "restart.target", "Delayd-Delay", "1500ms", "Delayd-Id", id), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	if got := e.Stored(c); got != 50 {
		t.Fatalf("stored after stop: %d", got)
	}
	e.StartDaemon(c)
	s.WaitCount(50, 10*time.Second)
	_, dups := s.Check(t, ids)
	if dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	if got := e.Stored(c); got != 0 {
		t.Errorf("%d envelopes left in Redis after delivery", got)
	}
}

func TestTwoDaemonsDeliverOnce(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.Lease = longLease
	e.StartDaemon(c)
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "two.target")
	const n = 2000
	ids := daemontest.ScheduleMany(t, nc, n, 8, "t", func(i int, h nats.Header) {
		h.Set("Delayd-Target", "two.target")
		h.Set("Delayd-Delay", fmt.Sprintf("%dms", 100+i%700))
	})
	s.WaitCount(n, 10*time.Second)
	daemontest.Quiet(t, e, c, s)
	lateness, dups := s.Check(t, ids)
	if dups != 0 {
		t.Errorf("%d duplicates with two daemons and no fault", dups)
	}
	logLateness(t, lateness)
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Limits.MaxPayload = 1024
	c.Limits.MaxIDLen = 64
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	ok := func(kv ...string) nats.Header {
		return daemontest.Hdr(append([]string{"Delayd-Target", "ok.target", "Delayd-Delay", "1h"}, kv...)...)
	}
	cases := []struct {
		name    string
		h       nats.Header
		payload string
		code    string
	}{
		{"missing target", daemontest.Hdr("Delayd-Delay", "1s"), "", "400"},
		{"wildcard target", daemontest.Hdr("Delayd-Target", "orders.*", "Delayd-Delay", "1s"), "", "400"},
		{"full wildcard target", daemontest.Hdr("Delayd-Target", ">", "Delayd-Delay", "1s"), "", "400"},
		{"empty token", daemontest.Hdr("Delayd-Target", "orders..x", "Delayd-Delay", "1s"), "", "400"},
		{"both at and delay", ok("Delayd-At", "2030-01-01T00:00:00Z"), "", "400"},
		{"neither at nor delay", daemontest.Hdr("Delayd-Target", "ok.target"), "", "400"},
		{"bad time", daemontest.Hdr("Delayd-Target", "ok.target", "Delayd-At", "tomorrow"), "", "400"},
		{"bad duration", daemontest.Hdr("Delayd-Target", "ok.target", "Delayd-Delay", "soon"), "", "400"},
		{"negative delay", daemontest.Hdr("Delayd-Target", "ok.target", "Delayd-Delay", "-5s"), "", "400"},
		{"delay over max", daemontest.Hdr("Delayd-Target", "ok.target", "Delayd-Delay", "9000h"), "", "400"},
		{"at too far in the past", daemontest.Hdr("Delayd-Target", "ok.target", "Delayd-At", "2001-01-01T00:00:00Z"), "", "400"},
		{"jitter over max", ok("Delayd-Jitter", "2h"), "", "400"},
		{"zero jitter", ok("Delayd-Jitter", "0s"), "", "400"},
		{"oversized payload", ok(), string(make([]byte, 1025)), "413"},
		{"over-long id", ok("Delayd-Id", string(make([]byte, 65))), "", "400"},
		{"control char in id", ok("Delayd-Id", "a\x01b"), "", "400"},
		{"unknown control header", ok("Delayd-Priority", "high"), "", "400"},
		{"system target", daemontest.Hdr("Delayd-Target", "$SYS.REQ.SERVER.PING", "Delayd-Delay", "1s"), "", "403"},
		{"jetstream api target", daemontest.Hdr("Delayd-Target", "$JS.API.STREAM.DELETE.X", "Delayd-Delay", "1s"), "", "403"},
		{"inbox target", daemontest.Hdr("Delayd-Target", "_INBOX.abc", "Delayd-Delay", "1s"), "", "403"},
		{"own subject loops", daemontest.Hdr("Delayd-Target", "delayd.schedule", "Delayd-Delay", "1s"), "", "403"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := daemontest.Schedule(nc, "delayd", tc.h, tc.payload)
			if err != nil {
				t.Fatal(err)
			}
			if got := rep.Header.Get(micro.ErrorCodeHeader); got != tc.code {
				t.Fatalf("code %q (%q), want %s", got, rep.Header.Get(micro.ErrorHeader), tc.code)
			}
			if rep.Header.Get(micro.ErrorHeader) == "" {
				t.Fatal("no error message")
			}
		})
	}
	// Cancel without an id is bad input too.
	crep, err := nc.RequestMsg(nats.NewMsg("delayd.cancel"), 5*time.Second)
	if err != nil || crep.Header.Get(micro.ErrorCodeHeader) != "400" {
		t.Fatalf("cancel without id: %v %v", err, crep.Header)
	}
	if n := e.Stored(c); n != 0 {
		t.Fatalf("%d envelopes stored from bad input", n)
	}
	// The daemon carries on.
	rep, err := daemontest.Schedule(nc, "delayd", ok("Delayd-Id", "fine"), "x")
	if err != nil || rep.Header.Get(micro.ErrorHeader) != "" {
		t.Fatalf("valid request after bad ones: %v %v", err, rep.Header)
	}
	if n := e.Stored(c); n != 1 {
		t.Fatalf("stored %d, want 1", n)
	}
}

// A header value that is not UTF-8 is stored and delivered byte for byte
// by every intake: a request, the durable intake, and a batch on either
// (the batch's JSON string carries the raw bytes). A batch once refused
// it with 400 while the durable intake stored it.
func TestHeaderValueNotUTF8Delivered(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	e.StartDaemon(e.Config())
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "latin1.t")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const v = "caf\xe9 \xff\xfe"
	single := func(id string) nats.Header {
		return daemontest.Hdr("Delayd-Target", "latin1.t", "Delayd-Delay", "10ms", "Delayd-Id", id, "X-Latin1", v)
	}
	batch := func(id string) []byte {
		return []byte(`[{"headers":{"Delayd-Target":"latin1.t","Delayd-Delay":"10ms","Delayd-Id":"` + id + `","X-Latin1":"` + v + `"},"payload":""}]`)
	}
	if rep, err := daemontest.Schedule(nc, "delayd", single("request"), "x"); err != nil || rep.Header.Get(micro.ErrorHeader) != "" {
		t.Errorf("request: %v %v", err, rep.Header)
	}
	rep, err := nc.RequestMsg(&nats.Msg{Subject: "delayd.schedule", Header: daemontest.Hdr("Delayd-Batch", "json"), Data: batch("batch")}, 5*time.Second)
	if err != nil || rep.Header.Get(micro.ErrorHeader) != "" || strings.Contains(string(rep.Data), `"code"`) {
		t.Errorf("batch: %v %v %s", err, rep.Header, rep.Data)
	}
	for _, m := range []*nats.Msg{
		{Subject: "delayd.intake", Header: single("stream")},
		{Subject: "delayd.intake", Header: daemontest.Hdr("Delayd-Batch", "json"), Data: batch("stream-batch")},
	} {
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	ids := []string{"request", "batch", "stream", "stream-batch"}
	s.WaitIDs(ids, 10*time.Second)
	for _, id := range ids {
		got := s.Get(id)
		if len(got) == 0 {
			t.Errorf("%s: not delivered", id)
		} else if h := got[0].Header.Get("X-Latin1"); h != v {
			t.Errorf("%s: X-Latin1 delivered as %q, want %q", id, h, v)
		}
	}
}
