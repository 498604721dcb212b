package systest

// Whole-daemon tests of recurring series (Delayd-Every, Delayd-Cron and the
// ADR-51 Nats-Schedule alias) against a real redis-server and nats-server:
// what only a whole daemon shows, the rule arithmetic being tested in
// internal/recur and the ack script in internal/store.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// checkSeries checks deliveries that should be occurrences from..from+n-1 of
// one series, each delivered once and on time: numbered in order, due every
// period, never early, first attempts.
func checkSeries(t *testing.T, ds []daemontest.Delivery, from int64, n int, period time.Duration) {
	t.Helper()
	if len(ds) != n {
		t.Fatalf("%d deliveries, want %d: %s", len(ds), n, daemontest.Describe(ds))
	}
	for i, d := range ds {
		if got := d.Occurrence(); got != from+int64(i) {
			t.Errorf("delivery %d is occurrence %d, want %d", i, got, from+int64(i))
		}
		if d.Attempt != 1 {
			t.Errorf("occurrence %d: attempt %d, want 1", d.Occurrence(), d.Attempt)
		}
		if d.Received.Before(d.Due) {
			t.Errorf("occurrence %d received %s before its due time", d.Occurrence(), d.Due.Sub(d.Received))
		}
		if i > 0 && d.Due.Sub(ds[i-1].Due) != period {
			t.Errorf("occurrence %d due %s after the previous one, want %s", d.Occurrence(), d.Due.Sub(ds[i-1].Due), period)
		}
	}
}

// notFound checks that delayd no longer keeps id.
func notFound(t *testing.T, cl *client.Client, id string) {
	t.Helper()
	if en, err := cl.Get(context.Background(), id); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("get %s after the series ended: %+v, %v; want not found", id, en, err)
	}
}

func TestSeriesEvery(t *testing.T) {
	e, nc, s := seriesDaemon(t, "series.every")
	payload := "tick \x00\xff"
	sr := daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.every", "Delayd-Every", "1s", "Delayd-Count", "3",
		"Delayd-Id", "ev", "traceparent", "00-abc-def-01", "X-Multi", "a", "X-Multi", "b"), payload)

	s.WaitFor("ev", 6*time.Second, daemontest.AtLeast(3))
	daemontest.Quiet(t, e, e.Config(), s) // the series ended: no fourth can come
	ds := s.Get("ev")
	checkSeries(t, ds, 1, 3, time.Second)
	if !ds[0].Due.Equal(sr.DeliverAt) {
		t.Errorf("first due %s, reply said %s", ds[0].Due, sr.DeliverAt)
	}
	for _, d := range ds {
		if d.Data != payload || d.Header.Get("traceparent") != "00-abc-def-01" || !slices.Equal(d.Header.Values("X-Multi"), []string{"a", "b"}) {
			t.Errorf("occurrence %d: payload %q or headers %v changed", d.Occurrence(), d.Data, d.Header)
		}
		if d.Header.Get("Delayd-Every") != "" || d.Header.Get("Delayd-Count") != "" || d.Header.Get("Delayd-Target") != "" {
			t.Errorf("occurrence %d: control headers leaked: %v", d.Occurrence(), d.Header)
		}
	}
	notFound(t, client.New(nc), "ev")
}

func TestSeriesCronTimeZone(t *testing.T) {
	e, nc, s := seriesDaemon(t, "series.cron")
	sr := daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.cron", "Delayd-Cron", "*/1 * * * * *",
		"Delayd-Time-Zone", "America/New_York", "Delayd-Count", "2", "Delayd-Id", "cr"), "c")

	s.WaitFor("cr", 5*time.Second, daemontest.AtLeast(2))
	daemontest.Quiet(t, e, e.Config(), s)
	ds := s.Get("cr")
	checkSeries(t, ds, 1, 2, time.Second)
	for _, d := range ds {
		if d.Due.Nanosecond() != 0 {
			t.Errorf("occurrence %d due %s: not on a whole second", d.Occurrence(), d.Due.Format(time.RFC3339Nano))
		}
	}
	if !ds[0].Due.Equal(sr.DeliverAt) {
		t.Errorf("first due %s, reply said %s", ds[0].Due, sr.DeliverAt)
	}
	notFound(t, client.New(nc), "cr")
}

func TestSeriesUntil(t *testing.T) {
	e, nc, s := seriesDaemon(t, "series.until")
	until := time.Now().Add(2500 * time.Millisecond).UTC()
	sr := daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.until", "Delayd-Every", "1s",
		"Delayd-Until", until.Format(time.RFC3339Nano), "Delayd-Id", "un"), "u")
	// Until is inclusive: every first + k·1s not after it.
	want := 0
	for due := sr.DeliverAt; !due.After(until); due = due.Add(time.Second) {
		want++
	}
	if want != 2 {
		t.Logf("first due %s, until %s: expecting %d occurrences", sr.DeliverAt.Format(time.RFC3339Nano), until.Format(time.RFC3339Nano), want)
	}

	s.WaitFor("un", time.Until(until)+2*time.Second, daemontest.AtLeast(want))
	daemontest.Quiet(t, e, e.Config(), s)
	ds := s.Get("un")
	checkSeries(t, ds, 1, want, time.Second)
	for _, d := range ds {
		if d.Due.After(until) {
			t.Errorf("occurrence %d due %s, after until %s", d.Occurrence(), d.Due.Format(time.RFC3339Nano), until.Format(time.RFC3339Nano))
		}
	}
	notFound(t, client.New(nc), "un")
}

func TestSeriesCancel(t *testing.T) {
	acks := daemontest.NewAcks()
	_, nc, s := seriesDaemon(t, "series.cancel", acks.Option())
	cl := client.New(nc)
	daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.cancel", "Delayd-Every", "1s", "Delayd-Id", "ca"), "c")

	if ds := s.WaitFor("ca", 4*time.Second, daemontest.AtLeast(1)); len(ds) == 0 {
		t.Fatal("occurrence 1 not delivered")
	}
	// Usually after the ack of occurrence 1; TestSeriesCancelWhileInFlight
	// makes sure of the race with it.
	r, err := cl.Cancel(context.Background(), "ca")
	if err != nil || !r.Cancelled {
		t.Fatalf("cancel: %+v, %v; want cancelled", r, err)
	}
	t.Logf("cancelled with in_flight=%v", r.InFlight)
	if r.InFlight {
		// The occurrence in flight is settled by an ack nothing outside
		// shows: wait for it.
		acks.Wait(t, "ca", 1, 5*time.Second)
	}
	s.Settle(t) // not in flight: the cancel removed all there was
	if ds := s.Get("ca"); len(ds) != 1 {
		t.Errorf("cancelled series delivered after the cancel: %s", daemontest.Describe(ds))
	}
	notFound(t, cl, "ca")
}

func TestSeriesReplace(t *testing.T) {
	e, nc, s := seriesDaemon(t, "series.replace")
	daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.replace", "Delayd-Every", "1s", "Delayd-Id", "re"), "old")

	if ds := s.WaitFor("re", 4*time.Second, daemontest.AtLeast(1)); len(ds) == 0 {
		t.Fatal("occurrence 1 not delivered")
	}
	// Usually after the ack; TestSeriesReplaceWhileInFlight races it.
	sr := daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.replace", "Delayd-Every", "1s", "Delayd-Count", "2", "Delayd-Id", "re"), "new")
	s.WaitFor("re", 5*time.Second, daemontest.AtLeast(3))
	daemontest.Quiet(t, e, e.Config(), s)
	var old, renewed []daemontest.Delivery
	for _, d := range s.Get("re") {
		if d.Data == "old" {
			old = append(old, d)
		} else {
			renewed = append(renewed, d)
		}
	}
	if len(old) != 1 || old[0].Occurrence() != 1 {
		t.Errorf("old series: want only occurrence 1, got %s", daemontest.Describe(old))
	}
	checkSeries(t, renewed, 1, 2, time.Second)
	if !renewed[0].Due.Equal(sr.DeliverAt) {
		t.Errorf("new series first due %s, reply said %s", renewed[0].Due, sr.DeliverAt)
	}
	notFound(t, client.New(nc), "re")
}

func TestSeriesGetPending(t *testing.T) {
	acks := daemontest.NewAcks()
	_, nc, s := seriesDaemon(t, "series.get", acks.Option())
	cl := client.New(nc)
	sr := daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.get", "Delayd-Every", "1s", "Delayd-Count", "3", "Delayd-Id", "ge"), "g")

	check := func(en client.Entry, n int64, due time.Time) {
		t.Helper()
		got, err := time.Parse(time.RFC3339Nano, en.Due)
		if en.State != "pending" || en.Series != "every 1s, count 3" || en.Occurrence != n || err != nil || !got.Equal(due) {
			t.Errorf("get: %+v; want pending, series %q, occurrence %d, due %s", en, "every 1s, count 3", n, due.Format(time.RFC3339Nano))
		}
	}
	en, err := cl.Get(context.Background(), "ge")
	if err != nil {
		t.Fatal(err)
	}
	check(en, 1, sr.DeliverAt)

	ds := s.WaitFor("ge", 4*time.Second, daemontest.AtLeast(1))
	if len(ds) == 0 {
		t.Fatal("occurrence 1 not delivered")
	}
	// Once occurrence 1 is acknowledged, the same entry is occurrence 2.
	acks.Wait(t, "ge", 1, 5*time.Second)
	if en, err = cl.Get(context.Background(), "ge"); err != nil {
		t.Fatal(err)
	}
	check(en, 2, ds[0].Due.Add(time.Second))
	if _, err := cl.Cancel(context.Background(), "ge"); err != nil {
		t.Fatal(err)
	}
}

// slowAckFleet runs an intake-only daemon connected to NATS directly and a
// scanner-only daemon whose NATS traffic from the server comes 400 ms late,
// so each flush, and with it the ack of each delivery, lags the delivery by
// 400 ms: a cancel or replace sent when an occurrence arrives reaches Redis
// while that occurrence is still in flight.
// The scanner reports its acks to the returned Acks.
func slowAckFleet(t *testing.T) (*daemontest.Env, config.Config, *daemontest.Acks) {
	e := daemontest.NewEnv(t)
	acks := daemontest.NewAcks()
	c := e.Config()
	ci := c
	ci.Mode = "intake"
	e.StartDaemon(ci)
	proxy := testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", e.NATS.Opts.Port))
	cs := c
	cs.Mode = "scanner"
	cs.NATS.URL = "nats://" + proxy.Addr()
	cs.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	e.StartDaemon(cs, acks.Option())
	proxy.Set(testutil.Down, testutil.Fault{Latency: 400 * time.Millisecond})
	return e, c, acks
}

// A cancel that lands while an occurrence is in flight ends the series: the
// in-flight occurrence's ack must not move it to a next occurrence.
func TestSeriesCancelWhileInFlight(t *testing.T) {
	t.Parallel()
	e, c, acks := slowAckFleet(t)
	nc := e.Conn()
	defer nc.Close()
	cl := client.New(nc)
	s := e.Sink(nc, "series.cif")
	daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.cif", "Delayd-Every", "1s", "Delayd-Id", "cif"), "c")
	if ds := s.WaitFor("cif", 6*time.Second, daemontest.AtLeast(1)); len(ds) == 0 {
		t.Fatal("occurrence 1 not delivered")
	}
	r, err := cl.Cancel(context.Background(), "cif")
	if err != nil || !r.Cancelled || !r.InFlight {
		t.Fatalf("cancel: %+v, %v; want cancelled and in flight", r, err)
	}
	acks.Wait(t, "cif", 1, 5*time.Second) // occurrence 1's, the only one
	if ds := s.Get("cif"); len(ds) != 1 {
		t.Errorf("series cancelled in flight delivered again: %s", daemontest.Describe(ds))
	}
	notFound(t, cl, "cif")
	if n := e.Stored(c); n != 0 {
		t.Errorf("%d envelopes left after the cancel", n)
	}
}

// A replace that lands while an occurrence of the old version is in flight
// wins: the old version's ack leaves the new one as stored, and the new
// series runs from occurrence 1.
func TestSeriesReplaceWhileInFlight(t *testing.T) {
	t.Parallel()
	e, c, acks := slowAckFleet(t)
	nc := e.Conn()
	defer nc.Close()
	st := e.InspectStore(c)
	s := e.Sink(nc, "series.rif")
	daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.rif", "Delayd-Every", "1s", "Delayd-Id", "rif"), "old")
	if ds := s.WaitFor("rif", 6*time.Second, daemontest.AtLeast(1)); len(ds) == 0 {
		t.Fatal("occurrence 1 not delivered")
	}
	if en, err := st.Get(context.Background(), "rif"); err != nil || en.State != store.StateInflight {
		t.Fatalf("occurrence 1 no longer in flight when replaced (%+v, %v): the test missed the race", en, err)
	}
	sr := daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.rif", "Delayd-Every", "1s", "Delayd-Count", "2", "Delayd-Id", "rif"), "new")
	acks.Wait(t, "rif", 1, 5*time.Second)
	if ds := s.Get("rif"); len(ds) != 1 {
		// The new series' first ack comes after its delivery.
		t.Fatalf("the first ack written came after the new series delivered (%s): the old occurrence's was lost", daemontest.Describe(ds))
	}
	en, err := client.New(nc).Get(context.Background(), "rif")
	if got, _ := time.Parse(time.RFC3339Nano, en.Due); err != nil || en.Occurrence != 1 || !got.Equal(sr.DeliverAt) || en.Series != "every 1s, count 2" {
		t.Errorf("after the old ack: %+v, %v; want the new series, occurrence 1, due %s", en, err, sr.DeliverAt.Format(time.RFC3339Nano))
	}
	s.WaitFor("rif", 6*time.Second, daemontest.AtLeast(3))
	daemontest.Quiet(t, e, c, s)
	var old, renewed []daemontest.Delivery
	for _, d := range s.Get("rif") {
		if d.Data == "old" {
			old = append(old, d)
		} else {
			renewed = append(renewed, d)
		}
	}
	if len(old) != 1 {
		t.Errorf("old series delivered after the replace: %s", daemontest.Describe(old))
	}
	checkSeries(t, renewed, 1, 2, time.Second)
	if n := e.Stored(c); n != 0 {
		t.Errorf("%d envelopes left after the series ended", n)
	}
}

// catchUp runs an Every 1s series, stops its only daemon gracefully after
// occurrence 1 for down, starts another and returns the deliveries until
// occurrence last arrived and the series ended, and when the restart began.
func catchUp(t *testing.T, id string, down time.Duration, last int64, extra ...string) ([]daemontest.Delivery, time.Time) {
	e := daemontest.NewEnv(t)
	c := e.Config()
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "series."+id)
	stop := e.StartDaemon(c)
	daemontest.ScheduleOK(t, nc, daemontest.Hdr(append([]string{"Delayd-Target", "series." + id, "Delayd-Every", "1s",
		"Delayd-Count", strconv.FormatInt(last, 10), "Delayd-Id", id}, extra...)...), id)
	if ds := s.WaitFor(id, 4*time.Second, daemontest.AtLeast(1)); len(ds) == 0 {
		t.Fatal("occurrence 1 not delivered")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(down) // no daemon runs for down: the point of the test
	if ds := s.Get(id); len(ds) != 1 {
		t.Fatalf("deliveries while no daemon ran: %s", daemontest.Describe(ds))
	}
	restart := time.Now()
	e.StartDaemon(c)
	s.WaitFor(id, 10*time.Second, daemontest.HasOccurrence(last))
	daemontest.Quiet(t, e, c, s)
	ds := s.Get(id)
	if en, err := client.New(nc).Get(context.Background(), id); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("get after the series ended: %+v, %v", en, err)
	}
	return ds, restart
}

// With the default catch-up, the occurrences missed while no daemon ran
// make one late delivery, and the series goes on after the restart in its
// phase, not with a burst.
func TestSeriesCatchUpOne(t *testing.T) {
	t.Parallel()
	ds, restart := catchUp(t, "cu1", 4*time.Second, 3)
	t.Logf("restart at %s:%s", restart.Format("15:04:05.000"), daemontest.Describe(ds))
	if len(ds) != 3 {
		t.Fatalf("%d deliveries, want 3 (1, one late, one after the restart)", len(ds))
	}
	for i, d := range ds {
		if d.Occurrence() != int64(i+1) || d.Attempt != 1 || d.Received.Before(d.Due) {
			t.Errorf("delivery %d: occurrence %d attempt %d, due %s received %s", i, d.Occurrence(), d.Attempt, d.Due, d.Received)
		}
	}
	late, next := ds[1], ds[2]
	if late.Due.Sub(ds[0].Due) != time.Second || !late.Due.Before(restart) {
		t.Errorf("late occurrence due %s after occurrence 1 (want 1s), restart %s", late.Due.Sub(ds[0].Due), restart)
	}
	if late.Received.Sub(restart) > 3*time.Second {
		t.Errorf("late occurrence arrived %s after the restart began", late.Received.Sub(restart))
	}
	if !next.Due.After(restart) || next.Due.Sub(ds[0].Due)%time.Second != 0 {
		t.Errorf("occurrence after the late one due %s, restart %s: want after the restart, in phase", next.Due, restart)
	}
}

// With Delayd-Catch-Up: all, every missed occurrence is delivered at once
// after the restart, each with its own due time.
func TestSeriesCatchUpAll(t *testing.T) {
	t.Parallel()
	ds, restart := catchUp(t, "cua", 4500*time.Millisecond, 5, "Delayd-Catch-Up", "all")
	t.Logf("restart at %s:%s", restart.Format("15:04:05.000"), daemontest.Describe(ds))
	checkSeries(t, ds, 1, 5, time.Second)
	missed := ds[1:]
	for _, d := range missed {
		if !d.Due.Before(restart) {
			t.Errorf("occurrence %d due %s, not missed (restart %s)", d.Occurrence(), d.Due, restart)
		}
	}
	if spread := missed[len(missed)-1].Received.Sub(missed[0].Received); spread > time.Second {
		t.Errorf("missed occurrences took %s to deliver, want a burst", spread)
	}
}

func TestAliasNATSSchedule(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "alias.>")

	daemontest.ScheduleOK(t, nc, daemontest.Hdr("Nats-Schedule", "@every 1s", "Nats-Schedule-Target", "alias.every", "Delayd-Count", "2", "Delayd-Id", "al-every"), "e")
	at := time.Now().Add(500 * time.Millisecond).UTC()
	sr := daemontest.ScheduleOK(t, nc, daemontest.Hdr("Nats-Schedule", "@at "+at.Format(time.RFC3339Nano), "Nats-Schedule-Target", "alias.at", "Delayd-Id", "al-at"), "a")
	if want := time.UnixMilli(at.UnixMilli() + 1); !sr.DeliverAt.Equal(time.UnixMilli(at.UnixMilli())) && !sr.DeliverAt.Equal(want) {
		t.Errorf("@at deliver_at %s, asked %s", sr.DeliverAt.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
	}

	refused := []struct {
		name string
		h    nats.Header
		says string
	}{
		{"source", daemontest.Hdr("Nats-Schedule", "@every 1s", "Nats-Schedule-Target", "alias.every", "Nats-Schedule-Source", "foo"), "Nats-Schedule-Source"},
		{"with delay", daemontest.Hdr("Nats-Schedule", "@every 1s", "Nats-Schedule-Target", "alias.every", "Delayd-Delay", "1s"), "Nats-Schedule"},
	}
	for _, tc := range refused {
		rep, err := daemontest.Schedule(nc, "delayd", tc.h, "x")
		if err != nil {
			t.Fatal(err)
		}
		if code, msg := rep.Header.Get(micro.ErrorCodeHeader), rep.Header.Get(micro.ErrorHeader); code != "400" || !strings.Contains(msg, tc.says) {
			t.Errorf("%s: %s %q, want 400 naming %s", tc.name, code, msg, tc.says)
		}
	}

	s.WaitFor("al-every", 5*time.Second, daemontest.AtLeast(2))
	daemontest.Quiet(t, e, c, s)
	checkSeries(t, s.Get("al-every"), 1, 2, time.Second)
	ats := s.Get("al-at")
	if len(ats) != 1 || ats[0].Received.Before(at) || ats[0].Header.Get(envelope.HeaderOccurrence) != "" || ats[0].Data != "a" {
		t.Errorf("@at: %s, want one delivery, not early, without Delayd-Occurrence", daemontest.Describe(ats))
	}
	for _, d := range append(s.Get("al-every"), ats...) {
		for k := range d.Header {
			if strings.HasPrefix(strings.ToLower(k), "nats-schedule") {
				t.Errorf("%s delivered with %s: %v", d.ID, k, d.Header)
			}
		}
	}
	if n := e.Stored(c); n != 0 {
		t.Errorf("%d envelopes left: the refused ones were stored, or a series did not end", n)
	}
}

func TestSeriesBadInput(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	cl := client.New(nc)
	before, err := cl.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		h    nats.Header
	}{
		{"every under 1s", daemontest.Hdr("Delayd-Every", "500ms")},
		{"bad cron", daemontest.Hdr("Delayd-Cron", "* * * *")},
		{"cron out of range", daemontest.Hdr("Delayd-Cron", "61 * * * * *")},
		{"bad zone", daemontest.Hdr("Delayd-Cron", "0 * * * * *", "Delayd-Time-Zone", "Mars/Olympus")},
		{"zone with every", daemontest.Hdr("Delayd-Every", "1s", "Delayd-Time-Zone", "UTC")},
		{"count without series", daemontest.Hdr("Delayd-Delay", "1s", "Delayd-Count", "2")},
		{"until past", daemontest.Hdr("Delayd-Every", "1s", "Delayd-Until", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))},
	}
	for i, tc := range cases {
		tc.h.Set("Delayd-Target", "bad.series")
		tc.h.Set("Delayd-Id", "bad-"+strconv.Itoa(i))
		rep, err := daemontest.Schedule(nc, "delayd", tc.h, "x")
		if err != nil {
			t.Fatal(err)
		}
		if code := rep.Header.Get(micro.ErrorCodeHeader); code != "400" || rep.Header.Get(micro.ErrorHeader) == "" {
			t.Errorf("%s: code %q (%q), want 400 with a message", tc.name, code, rep.Header.Get(micro.ErrorHeader))
		}
	}
	after, err := cl.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if after.Pending != before.Pending || e.Stored(c) != 0 {
		t.Errorf("pending %d before, %d after bad requests (%d stored)", before.Pending, after.Pending, e.Stored(c))
	}
}

// seriesDaemon starts a parallel test's servers and daemon, a connection,
// and a sink on target.
func seriesDaemon(t *testing.T, target string, opts ...daemon.Option) (*daemontest.Env, *nats.Conn, *daemontest.Sink) {
	t.Helper()
	t.Parallel()
	e := daemontest.NewEnv(t)
	e.StartDaemon(e.Config(), opts...)
	nc := e.Conn()
	t.Cleanup(nc.Close)
	return e, nc, e.Sink(nc, target)
}

// TestSeriesEveryWithSkewedClock: the first occurrence of an Every series
// without Start is now + Every by Redis' clock, like a Delayd-Delay, so a
// daemon whose clock is 30 s behind cannot deliver it 10 s early.
func TestSeriesEveryWithSkewedClock(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	e.StartDaemon(e.Config(), daemon.WithClock(func() time.Time { return time.Now().Add(-30 * time.Second) }))
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "series.skew")
	sent := time.Now()
	sr := daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.skew", "Delayd-Every", "2s", "Delayd-Count", "1", "Delayd-Id", "sk"), "x")
	if d := sr.DeliverAt.Sub(sent); d < 2*time.Second-50*time.Millisecond || d > 3*time.Second {
		t.Fatalf("first occurrence due %s after the request, want 2s", d)
	}
	s.WaitFor("sk", 5*time.Second, daemontest.AtLeast(1))
	if d := s.Get("sk")[0]; d.Received.Before(d.Due) || d.Received.Sub(sent) < 2*time.Second-50*time.Millisecond {
		t.Fatalf("delivered %s after the request (due %s)", d.Received.Sub(sent), d.Due.Sub(sent))
	}
}
