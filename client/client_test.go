package client_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/client"
)

// TestErrorsFromTheDaemon: each refusal of the real daemon matches its
// sentinel, and the *ServiceError keeps the code and the daemon's reason.
func TestErrorsFromTheDaemon(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	c := client.New(nc)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		want error
		code int
	}{
		{"wildcard target", func() error { _, err := c.Schedule(ctx, "orders.*", nil, client.Delay(time.Second)); return err }, client.ErrBadRequest, 400},
		{"Nats-* header", func() error {
			_, err := c.Schedule(ctx, "orders.x", nil, client.Delay(time.Second), client.Header("Nats-Msg-Id", "1"))
			return err
		}, client.ErrBadRequest, 400},
		{"$SYS target", func() error { _, err := c.Schedule(ctx, "$SYS.x", nil, client.Delay(time.Second)); return err }, client.ErrForbidden, 403},
		{"_INBOX target", func() error { _, err := c.Schedule(ctx, "_INBOX.x", nil, client.Delay(time.Second)); return err }, client.ErrForbidden, 403},
		{"payload over limits.max_payload", func() error {
			_, err := c.Schedule(ctx, "orders.x", make([]byte, 100_000), client.Delay(time.Second))
			return err
		}, client.ErrTooLarge, 413},
		{"get of a missing id", func() error { _, err := c.Get(ctx, "no-such-id"); return err }, client.ErrNotFound, 404},
		{"list limit over 1000", func() error { _, err := c.List(ctx, client.ListRequest{Limit: 5000}); return err }, client.ErrBadRequest, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var se *client.ServiceError
			if !errors.Is(err, tc.want) || !errors.As(err, &se) || se.Code != tc.code || se.Message == "" {
				t.Fatalf("got %v, want a %d matching %v", err, tc.code, tc.want)
			}
		})
	}
}

// TestNoDaemon: no responders on a prefix no delayd serves is
// ErrUnavailable, for requests and for the stream intake alike.
func TestNoDaemon(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	c := client.New(nc, client.Prefix("nobody"))
	_, err := c.Schedule(context.Background(), "orders.x", nil, client.Delay(time.Second))
	if !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("schedule: %v, want ErrUnavailable", err)
	}
	_, err = c.Publish(context.Background(), "orders.x", nil, client.Delay(time.Second))
	if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "no stream captures nobody.intake") {
		t.Errorf("publish: %v, want ErrUnavailable naming the subject", err)
	}
}

// fake answers requests on <prefix>.schedule as reply says, recording
// each request. It runs on the real nats-server: it stands in for a
// daemon only where a daemon's answer cannot be provoked on demand (a 504
// needs Redis to time out after the write).
type fake struct {
	mu   sync.Mutex
	reqs []*nats.Msg
}

func startFake(t *testing.T, nc *nats.Conn, prefix string, reply func(n int, m *nats.Msg) *nats.Msg) *fake {
	t.Helper()
	f := &fake{}
	sub, err := nc.Subscribe(prefix+".schedule", func(m *nats.Msg) {
		f.mu.Lock()
		f.reqs = append(f.reqs, m)
		n := len(f.reqs)
		f.mu.Unlock()
		if r := reply(n, m); r != nil {
			r.Subject = m.Reply
			_ = nc.PublishMsg(r)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fake) requests() []*nats.Msg {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*nats.Msg(nil), f.reqs...)
}

func serviceError(code, msg, body string) *nats.Msg {
	return &nats.Msg{Data: []byte(body), Header: nats.Header{micro.ErrorHeader: {msg}, micro.ErrorCodeHeader: {code}}}
}

// TestEveryCodeMatchesItsSentinel, including the 504's id and a code
// delayd does not use.
func TestEveryCodeMatchesItsSentinel(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	for code, want := range map[string]error{"400": client.ErrBadRequest, "403": client.ErrForbidden, "404": client.ErrNotFound,
		"413": client.ErrTooLarge, "503": client.ErrUnavailable, "504": client.ErrOutcomeUnknown, "500": nil} {
		prefix := "fake" + code
		startFake(t, nc, prefix, func(int, *nats.Msg) *nats.Msg { return serviceError(code, "why "+code, `{"id":"the-id"}`) })
		_, err := client.New(nc, client.Prefix(prefix)).Schedule(context.Background(), "orders.x", nil, client.Delay(time.Second))
		var se *client.ServiceError
		if !errors.As(err, &se) || se.Message != "why "+code || se.ID != "the-id" || err.Error() != "why "+code+" (code "+code+")" {
			t.Errorf("%s: %v (%#v)", code, err, se)
		}
		for _, s := range []error{client.ErrBadRequest, client.ErrForbidden, client.ErrNotFound, client.ErrTooLarge, client.ErrUnavailable, client.ErrOutcomeUnknown} {
			if errors.Is(err, s) != (s == want) {
				t.Errorf("%s: errors.Is(err, %v) = %v", code, s, !(s == want))
			}
		}
	}
}

// TestNoReplyIsAnUnknownOutcome: a request sent and not answered before
// the deadline may have been stored.
func TestNoReplyIsAnUnknownOutcome(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	f := startFake(t, nc, "silent", func(int, *nats.Msg) *nats.Msg { return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := client.New(nc, client.Prefix("silent")).Schedule(ctx, "orders.x", nil, client.Delay(time.Second), client.ID("o-1"))
	if !errors.Is(err, client.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "retry with id o-1") {
		t.Errorf("got %v", err)
	}
	// A context already over sends nothing: that outcome is known.
	_, err = client.New(nc, client.Prefix("silent")).Schedule(ctx, "orders.x", nil, client.Delay(time.Second))
	if errors.Is(err, client.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) || len(f.requests()) != 1 {
		t.Errorf("ended context: %v after %d requests", err, len(f.requests()))
	}
}

// TestScheduleHeaders: what each option sends.
func TestScheduleHeaders(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	f := startFake(t, nc, "hdr", func(int, *nats.Msg) *nats.Msg {
		return &nats.Msg{Data: []byte(`{"id":"x","deliver_at":"2026-11-30T10:00:05.123Z"}`)}
	})
	c := client.New(nc, client.Prefix("hdr"))
	start := time.Date(2026, 12, 1, 9, 0, 0, 500, time.FixedZone("CET", 3600))
	for _, tc := range []struct {
		opts []client.ScheduleOption
		want map[string][]string
	}{
		{[]client.ScheduleOption{client.At(start), client.ID("a"), client.Header("X-K", "1"), client.Header("X-K", "2")},
			map[string][]string{"Delayd-At": {"2026-12-01T08:00:00.0000005Z"}, "Delayd-Id": {"a"}, "X-K": {"1", "2"}}},
		{[]client.ScheduleOption{client.Delay(1500 * time.Millisecond)}, map[string][]string{"Delayd-Delay": {"1.5s"}}},
		{[]client.ScheduleOption{client.Delay(time.Minute), client.Jitter(2 * time.Second)},
			map[string][]string{"Delayd-Delay": {"1m0s"}, "Delayd-Jitter": {"2s"}}},
		{[]client.ScheduleOption{client.Every(90 * time.Minute), client.Start(start), client.Until(start.Add(time.Hour)), client.Count(3), client.CatchUpAll()},
			map[string][]string{"Delayd-Every": {"1h30m0s"}, "Delayd-Start": {"2026-12-01T08:00:00.0000005Z"},
				"Delayd-Until": {"2026-12-01T09:00:00.0000005Z"}, "Delayd-Count": {"3"}, "Delayd-Catch-Up": {"all"}}},
		{[]client.ScheduleOption{client.Cron("0 9 * * MON-FRI"), client.TimeZone("Europe/Paris")},
			map[string][]string{"Delayd-Cron": {"0 9 * * MON-FRI"}, "Delayd-Time-Zone": {"Europe/Paris"}}},
	} {
		s, err := c.Schedule(context.Background(), "orders.x", []byte("p"), tc.opts...)
		if err != nil || s.ID != "x" || !s.DeliverAt.Equal(time.Date(2026, 11, 30, 10, 0, 5, 123e6, time.UTC)) {
			t.Fatalf("%v: %+v", err, s)
		}
		reqs := f.requests()
		h := reqs[len(reqs)-1].Header
		tc.want["Delayd-Target"] = []string{"orders.x"}
		if len(h) != len(tc.want) {
			t.Errorf("sent %v, want %v", h, tc.want)
		}
		for k, v := range tc.want {
			if strings.Join(h.Values(k), ",") != strings.Join(v, ",") {
				t.Errorf("%s: sent %q, want %q", k, h.Values(k), v)
			}
		}
	}
}

// TestOptionsCheckedBeforeSending: each mistake is an ErrBadRequest that
// says why, and nothing is sent.
func TestOptionsCheckedBeforeSending(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	f := startFake(t, nc, "opts", func(int, *nats.Msg) *nats.Msg { return &nats.Msg{Data: []byte(`{}`)} })
	c := client.New(nc, client.Prefix("opts"))
	now := time.Now()
	for _, tc := range []struct {
		target string
		opts   []client.ScheduleOption
		why    string
	}{
		{"orders.x", nil, "exactly one of At, Delay, Every and Cron"},
		{"orders.x", []client.ScheduleOption{client.Delay(time.Second), client.Cron("* * * * *")}, "got 2 [Delay Cron]"},
		{"", []client.ScheduleOption{client.Delay(time.Second)}, "empty target"},
		{"orders.x", []client.ScheduleOption{client.Delay(-time.Second)}, "negative Delay"},
		{"orders.x", []client.ScheduleOption{client.Every(0)}, "positive interval"},
		{"orders.x", []client.ScheduleOption{client.Cron(" ")}, "empty Cron"},
		{"orders.x", []client.ScheduleOption{client.Every(time.Hour), client.Count(0)}, "Count must be at least 1"},
		{"orders.x", []client.ScheduleOption{client.Delay(time.Hour), client.Jitter(0)}, "Jitter must be at least 1ms"},
		{"orders.x", []client.ScheduleOption{client.Every(time.Hour), client.TimeZone("UTC")}, "TimeZone is for Cron"},
		{"orders.x", []client.ScheduleOption{client.Delay(time.Hour), client.Count(2)}, "are for Every and Cron"},
		{"orders.x", []client.ScheduleOption{client.Every(time.Hour), client.Start(now), client.Until(now.Add(-time.Second))}, "is before Start"},
		{"orders.x", []client.ScheduleOption{client.Delay(time.Hour), client.ID("")}, "empty ID"},
		{"orders.x", []client.ScheduleOption{client.Delay(time.Hour), client.Header("delayd-at", "x")}, "control header"},
	} {
		_, err := c.Schedule(context.Background(), tc.target, nil, tc.opts...)
		if !errors.Is(err, client.ErrBadRequest) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("got %v, want ErrBadRequest saying %q", err, tc.why)
		}
		if _, err := c.Publish(context.Background(), tc.target, nil, tc.opts...); !errors.Is(err, client.ErrBadRequest) {
			t.Errorf("publish: got %v, want ErrBadRequest", err)
		}
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("%d requests sent", n)
	}
}

// TestScheduleRetryingResendsTheSameID through 504, 503 and a lost reply,
// and stops at once on a refusal.
func TestScheduleRetryingResendsTheSameID(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	f := startFake(t, nc, "flaky", func(n int, m *nats.Msg) *nats.Msg {
		switch n {
		case 1:
			return serviceError("504", "store timed out", `{"id":"`+m.Header.Get("Delayd-Id")+`"}`)
		case 2:
			return serviceError("503", "store unavailable", "")
		case 3:
			return nil // lost: the attempt times out
		}
		return &nats.Msg{Data: []byte(`{"id":"` + m.Header.Get("Delayd-Id") + `","deliver_at":"2026-11-30T10:00:00Z"}`)}
	})
	c := client.New(nc, client.Prefix("flaky"), client.RetryTimeout(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.ScheduleRetrying(ctx, "orders.x", []byte("p"), client.Delay(time.Minute))
	reqs := f.requests()
	if err != nil || len(reqs) != 4 || s.ID == "" {
		t.Fatalf("%v after %d requests: %+v", err, len(reqs), s)
	}
	for _, r := range reqs {
		if r.Header.Get("Delayd-Id") != s.ID || string(r.Data) != "p" {
			t.Errorf("attempt with id %q and payload %q, want %q", r.Header.Get("Delayd-Id"), r.Data, s.ID)
		}
	}

	refuse := startFake(t, nc, "refuse", func(int, *nats.Msg) *nats.Msg { return serviceError("403", "target not allowed", "") })
	_, err = client.New(nc, client.Prefix("refuse")).ScheduleRetrying(ctx, "orders.x", nil, client.Delay(time.Minute), client.ID("mine"))
	if !errors.Is(err, client.ErrForbidden) || len(refuse.requests()) != 1 || refuse.requests()[0].Header.Get("Delayd-Id") != "mine" {
		t.Errorf("refused: %v after %d requests", err, len(refuse.requests()))
	}

	// Nobody answers: it keeps trying until ctx ends, then says why.
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if _, err := client.New(nc, client.Prefix("nobody")).ScheduleRetrying(short, "orders.x", nil, client.Delay(time.Minute)); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("no daemon: %v", err)
	}
}

// Every error ScheduleRetrying returns when its context ends matches a
// sentinel, whenever the context ends: between attempts, before one is
// sent, or during one. (It once returned "not sent: context deadline
// exceeded", matching neither, in 4 of 200 calls.) And once an attempt's
// outcome was unknown, a later attempt that wrote nothing does not make
// the answer "unavailable".
func TestScheduleRetryingErrorsMatchASentinel(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	c := client.New(nc, client.Prefix("nobody-at-all"), client.RetryTimeout(20*time.Millisecond))
	for i := 0; i < 200; i++ { // not range 200: the module is Go 1.21
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i%40)*time.Millisecond)
		_, err := c.ScheduleRetrying(ctx, "orders.x", nil, client.Delay(time.Minute))
		cancel()
		if !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Fatalf("call %d: %v matches neither ErrUnavailable nor ErrOutcomeUnknown", i, err)
		}
	}
	f := startFake(t, nc, "lost-then-down", func(n int, m *nats.Msg) *nats.Msg {
		if n == 1 {
			return nil // lost: the outcome of this attempt is unknown
		}
		return serviceError("503", "store unavailable", "")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := client.New(nc, client.Prefix("lost-then-down"), client.RetryTimeout(50*time.Millisecond)).
		ScheduleRetrying(ctx, "orders.x", nil, client.Delay(time.Minute))
	if !errors.Is(err, client.ErrOutcomeUnknown) || len(f.requests()) < 2 {
		t.Fatalf("after a lost reply and then 503s: %v (%d requests), want ErrOutcomeUnknown", err, len(f.requests()))
	}
}

// TestAdminCalls: the operator endpoints of the real daemon, end to end.
func TestAdminCalls(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	c := client.New(nc)
	ctx := context.Background()
	if _, err := c.Schedule(ctx, "admin.test", []byte("abc"), client.Delay(time.Hour), client.ID("adm-1"), client.Header("X-K", "v")); err != nil {
		t.Fatal(err)
	}
	e, err := c.Get(ctx, "adm-1")
	if err != nil || e.State != "pending" || e.Target != "admin.test" || e.Size != 3 || e.Header["X-K"][0] != "v" {
		t.Errorf("get: %v %+v", err, e)
	}
	page, err := c.List(ctx, client.ListRequest{Target: "admin.>"})
	if err != nil || len(page.Entries) != 1 || page.Entries[0].ID != "adm-1" {
		t.Errorf("list: %v %+v", err, page)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.Pending < 1 || len(st.Shards) != 4 {
		t.Errorf("stats: %v %+v", err, st)
	}
	for name, act := range map[string]func(context.Context, client.DeadSelection) (client.DeadResult, error){"replay": c.Replay, "purge": c.Purge} {
		if r, err := act(ctx, client.DeadSelection{IDs: []string{"not-dead"}}); err != nil || r.Count != 0 {
			t.Errorf("%s: %v %+v", name, err, r)
		}
		if _, err := act(ctx, client.DeadSelection{}); !errors.Is(err, client.ErrBadRequest) {
			t.Errorf("%s of nothing: %v, want ErrBadRequest", name, err)
		}
	}
	if _, err := c.Cancel(ctx, "adm-1"); err != nil {
		t.Error(err)
	}
}

// TestClosedConnectionIsUnavailable: a request that a closed connection
// could not send reached nobody: ErrUnavailable, which ScheduleRetrying
// retries, not an unknown outcome.
func TestClosedConnectionIsUnavailable(t *testing.T) {
	nc := connect(t)
	nc.Close()
	c := client.New(nc)
	_, err := c.Schedule(context.Background(), "orders.x", nil, client.Delay(time.Second))
	if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("schedule: got %v, want ErrUnavailable", err)
	}
	if _, err := c.Publish(context.Background(), "orders.x", nil, client.Delay(time.Second)); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("publish: got %v, want ErrUnavailable", err)
	}
	// Nothing will ever send: the retrying call gives up at once.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.ScheduleRetrying(ctx, "orders.x", nil, client.Delay(time.Second)); !errors.Is(err, client.ErrUnavailable) || ctx.Err() != nil {
		t.Fatalf("retrying: got %v after %v", err, ctx.Err())
	}
}

// TestOverMaxPayloadIsTooLarge: a message the connection refuses as over
// the server's max_payload is ErrTooLarge, like delayd's own 413.
func TestOverMaxPayloadIsTooLarge(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	c := client.New(nc, client.Prefix("too-large"))
	big := make([]byte, nc.MaxPayload()+1)
	_, err := c.Schedule(context.Background(), "orders.x", big, client.Delay(time.Second))
	if !errors.Is(err, client.ErrTooLarge) {
		t.Fatalf("schedule: got %v, want ErrTooLarge", err)
	}
	if _, err := c.Publish(context.Background(), "orders.x", big, client.Delay(time.Second)); !errors.Is(err, client.ErrTooLarge) {
		t.Fatalf("publish: got %v, want ErrTooLarge", err)
	}
}
