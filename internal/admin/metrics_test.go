package admin

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/flow"
	"github.com/delayd/delayd/internal/scanner"
)

// A delivery that reached no subscriber counts as no_interest, not failed;
// every result exists from the start, at 0, so a rate() over it works
// before the first one.
func TestDeliveredResults(t *testing.T) {
	m := NewMetrics("test", "all")
	value := func(c prometheus.Counter) float64 {
		var out dto.Metric
		if err := c.Write(&out); err != nil {
			t.Fatal(err)
		}
		return out.GetCounter().GetValue()
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "delayd_envelopes_delivered_total" && len(f.GetMetric()) != 3 {
			t.Fatalf("%d series before any delivery, want 3 (ok, failed, no_interest)", len(f.GetMetric()))
		}
	}
	for _, r := range []string{"ok", "failed", "no_interest"} {
		if v := value(m.delivered.WithLabelValues(r)); v != 0 {
			t.Fatalf("%s starts at %v", r, v)
		}
	}
	d := envelope.Delivery{ID: "a", Due: time.Now(), Envelope: envelope.Envelope{Target: "t"}}
	m.Delivered(d, fmt.Errorf("publish to t: %w", scanner.ErrNoInterest))
	m.Delivered(d, fmt.Errorf("publish to t: %w", scanner.ErrNoInterest))
	m.Delivered(d, errors.New("flush not confirmed"))
	m.Delivered(d, nil)
	for r, want := range map[string]float64{"ok": 1, "failed": 1, "no_interest": 2} {
		if v := value(m.delivered.WithLabelValues(r)); v != want {
			t.Errorf("%s = %v, want %v", r, v, want)
		}
	}
}

// A Delayd-At accepted 2 h in the past and delivered at once is not 2 h
// late: lateness counts from when it was stored, so it lands in the first
// buckets, not +Inf, and cannot trip the lateness alert.
func TestLatenessOfAPastDueEnvelope(t *testing.T) {
	m := NewMetrics("test", "all")
	now := time.Now()
	m.Delivered(envelope.Delivery{ID: "old", Due: now.Add(-2 * time.Hour),
		Envelope: envelope.Envelope{Target: "t", Stored: now}}, nil)
	var out dto.Metric
	if err := m.lateness.Write(&out); err != nil {
		t.Fatal(err)
	}
	h := out.GetHistogram()
	if h.GetSampleCount() != 1 || h.GetSampleSum() > 1 {
		t.Fatalf("lateness: %d samples summing to %.1f s, want one under 1 s", h.GetSampleCount(), h.GetSampleSum())
	}
}

// delayd_build_info carries the daemon's mode, so an alert can tell the
// daemons that scan (all, scanner) from intake-only ones, which never own
// a shard.
func TestBuildInfoNamesTheMode(t *testing.T) {
	for _, mode := range []string{"all", "intake", "scanner"} {
		m := NewMetrics("1.2.3", mode)
		families, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]string
		for _, f := range families {
			if f.GetName() != "delayd_build_info" {
				continue
			}
			for _, s := range f.GetMetric() {
				got = map[string]string{}
				for _, l := range s.GetLabel() {
					got[l.GetName()] = l.GetValue()
				}
			}
		}
		if got["mode"] != mode || got["version"] != "1.2.3" {
			t.Errorf("mode %s: delayd_build_info labels %v", mode, got)
		}
	}
}

// Every byte budget is a gauge read at scrape time, delayd_<budget>_held_bytes,
// so an operator sees one that does not return to 0.
func TestHeldBytesGauges(t *testing.T) {
	m := NewMetrics("test", "all")
	for i, b := range HeldBudgets {
		n := int64(i + 1)
		m.WatchHeld(b, func() int64 { return n })
	}
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if len(f.GetMetric()) == 1 && f.GetMetric()[0].GetGauge() != nil {
			got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	want := map[string]float64{"delayd_claims_held_bytes": 1, "delayd_settles_held_bytes": 2,
		"delayd_request_intake_held_bytes": 3, "delayd_stream_intake_held_bytes": 4}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
}

// A scrape while the reporter samples sees the flow gauges every time:
// they used to be Reset and then set again, and a scrape between the two
// (CI's dashboard test did one) found no flow metric at all. A pattern no
// longer reported is still removed.
func TestFlowGaugesNeverGoMissing(t *testing.T) {
	m := NewMetrics("test", "all")
	patterns := []flow.Status{{Pattern: "a.>", Rate: "1/s", Burst: 1, PausedSince: time.Now()}}
	m.WatchFlow(func() []flow.Status { return patterns })
	m.sampleFlow(true)
	series := func(name string) int {
		fams, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == name {
				return len(f.GetMetric())
			}
		}
		return 0
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2000 {
			m.sampleFlow(true)
		}
	}()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		for _, name := range []string{"delayd_flow_rate", "delayd_flow_paused_seconds", "delayd_flow_drain_seconds"} {
			if n := series(name); n != 1 {
				t.Fatalf("a scrape during sampling saw %d series of %s, want 1", n, name)
			}
		}
	}
	if n := series("delayd_flow_held_envelopes"); n != 2 {
		t.Fatalf("%d held series, want 2 (limit and pause)", n)
	}
	patterns = []flow.Status{{Pattern: "b.>", Rate: "2/s", Burst: 1}}
	m.sampleFlow(true)
	if n := series("delayd_flow_paused_seconds"); n != 0 {
		t.Fatalf("the pause of a.> still exported (%d series)", n)
	}
	if n := series("delayd_flow_held_envelopes"); n != 1 {
		t.Fatalf("%d held series after a.> left, want 1 (b.>'s limit)", n)
	}
	m.sampleFlow(false)
	if n := series("delayd_flow_rate"); n != 0 {
		t.Fatalf("a daemon no longer the reporter still exports %d rate series", n)
	}
}

// A pattern that is not UTF-8 (the rules refuse one, but a hand-written
// field got through) is no panic: every daemon crashed in turn on one as
// the metrics' reporter.
func TestFlowLabelsNotUTF8(t *testing.T) {
	m := NewMetrics("test", "all")
	m.Held("\xff.x", "limit", 1)
	m.Allowed("caf\xe9.x", time.Millisecond)
	m.WatchFlow(func() []flow.Status { return []flow.Status{{Pattern: "\xff.x", Rate: "1/s", Burst: 1}} })
	m.sampleFlow(true)
	if _, err := m.Registry.Gather(); err != nil {
		t.Fatal(err)
	}
}
