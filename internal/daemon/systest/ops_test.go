package systest

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

func TestMetricsMove(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.HTTP.SampleInterval = 100 * time.Millisecond
	e.StartDaemon(c)
	base := "http://" + c.HTTP.Addr
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "metrics.target")
	_, before := daemontest.HTTPGet(t, base+"/metrics")
	names := []string{"delayd_envelopes_received_total", "delayd_envelopes_delivered_total",
		"delayd_delivery_lateness_seconds_bucket", "delayd_pending_envelopes", "delayd_inflight_envelopes",
		"delayd_dead_envelopes", "delayd_oldest_overdue_seconds", "delayd_claim_duration_seconds_count",
		"delayd_redis_errors_total", "delayd_nats_reconnects_total", "delayd_shards_owned", "delayd_build_info",
		"delayd_shards", "delayd_nats_connected", "delayd_redis_connected", "delayd_cancels_total",
		"delayd_redeliveries_total", "delayd_intake_duration_seconds_count",
		"delayd_claims_held_bytes", "delayd_settles_held_bytes", "delayd_request_intake_held_bytes"}
	for _, n := range names {
		if _, ok := daemontest.Metric(before, n); !ok {
			t.Errorf("metric %s missing", n)
		}
	}
	for i := range 20 {
		delay := "200ms"
		if i >= 10 {
			delay = "1h"
		}
		if _, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "metrics.target", "Delayd-Delay", delay), "x"); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "$SYS.X", "Delayd-Delay", "1s"), "x")
	// Cancel and get are not schedule requests: they must not be counted
	// as received (they once minted a result="404" series).
	for _, ep := range []string{"cancel", "admin.get"} {
		if _, err := nc.RequestMsg(&nats.Msg{Subject: "delayd." + ep, Header: daemontest.Hdr("Delayd-Id", "no-such-id")}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	s.WaitCount(10, 5*time.Second)
	// The counters move once a delivery is confirmed, the gauges once a
	// sample is taken after it: wait until both show the 10 delivered.
	var after string
	testutil.Eventually(5*time.Second, func() bool {
		_, after = daemontest.HTTPGet(t, base+"/metrics")
		for _, n := range []string{"delayd_envelopes_delivered_total", "delayd_delivery_lateness_seconds_count",
			"delayd_pending_envelopes", `delayd_backlog_envelopes{state="pending"}`} {
			if v, _ := daemontest.Metric(after, n); v != 10 {
				return false
			}
		}
		return true
	})
	for _, tc := range []struct {
		name string
		want float64
	}{
		{"delayd_envelopes_received_total", 21},
		{"delayd_envelopes_delivered_total", 10},
		{"delayd_delivery_lateness_seconds_count", 10},
		{"delayd_pending_envelopes", 10},
		{"delayd_shards_owned", float64(c.Shards)},
		{"delayd_shards", float64(c.Shards)},
		{"delayd_intake_duration_seconds_count", 20},
		// This daemon owns shard 0, so it reports every shard.
		{`delayd_backlog_envelopes{state="pending"}`, 10},
		{"delayd_shards_unowned", 0},
		{"delayd_nats_connected", 1},
		{"delayd_redis_connected", 1},
	} {
		if v, _ := daemontest.Metric(after, tc.name); v != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, v, tc.want)
		}
	}
	if !strings.Contains(after, `delayd_envelopes_received_total{result="forbidden"} 1`) {
		t.Error("forbidden request not counted by result")
	}
	// The harness probes readiness with a cancel too: count the difference.
	b, _ := daemontest.Metric(before, `delayd_cancels_total{result="not_found"}`)
	if a, _ := daemontest.Metric(after, `delayd_cancels_total{result="not_found"}`); a-b != 1 {
		t.Errorf("cancels not found went from %v to %v, want one more", b, a)
	}
	if _, ok := daemontest.Metric(after, "delayd_shards_unowned"); !ok {
		t.Error("the owner of shard 0 does not report delayd_shards_unowned")
	}
	if strings.Contains(after, `result="404"`) {
		t.Error("a get or cancel minted a result=\"404\" series")
	}
	if v, _ := daemontest.Metric(after, "delayd_claim_duration_seconds_count"); v == 0 {
		t.Error("claim duration did not move")
	}
}
