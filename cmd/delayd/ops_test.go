package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the sum of every sample of a metric family in an exposition.
func metric(body, name string) (float64, bool) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? ([0-9.e+-]+)$`)
	ms := re.FindAllStringSubmatch(body, -1)
	sum := 0.0
	for _, m := range ms {
		v, _ := strconv.ParseFloat(m[2], 64)
		sum += v
	}
	return sum, len(ms) > 0
}

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
	_, before := httpGet(t, base+"/metrics")
	names := []string{"delayd_envelopes_received_total", "delayd_envelopes_delivered_total",
		"delayd_delivery_lateness_seconds_bucket", "delayd_pending_envelopes", "delayd_inflight_envelopes",
		"delayd_dead_envelopes", "delayd_oldest_overdue_seconds", "delayd_claim_duration_seconds_count",
		"delayd_redis_errors_total", "delayd_nats_reconnects_total", "delayd_shards_owned", "delayd_build_info",
		"delayd_shards", "delayd_nats_connected", "delayd_redis_connected", "delayd_cancels_total",
		"delayd_redeliveries_total", "delayd_intake_duration_seconds_count"}
	for _, n := range names {
		if _, ok := metric(before, n); !ok {
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
	time.Sleep(300 * time.Millisecond) // a sample interval
	_, after := httpGet(t, base+"/metrics")
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
		if v, _ := metric(after, tc.name); v != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, v, tc.want)
		}
	}
	if !strings.Contains(after, `delayd_envelopes_received_total{result="forbidden"} 1`) {
		t.Error("forbidden request not counted by result")
	}
	// The harness probes readiness with a cancel too: count the difference.
	b, _ := metric(before, `delayd_cancels_total{result="not_found"}`)
	if a, _ := metric(after, `delayd_cancels_total{result="not_found"}`); a-b != 1 {
		t.Errorf("cancels not found went from %v to %v, want one more", b, a)
	}
	if _, ok := metric(after, "delayd_shards_unowned"); !ok {
		t.Error("the owner of shard 0 does not report delayd_shards_unowned")
	}
	if strings.Contains(after, `result="404"`) {
		t.Error("a get or cancel minted a result=\"404\" series")
	}
	if v, _ := metric(after, "delayd_claim_duration_seconds_count"); v == 0 {
		t.Error("claim duration did not move")
	}
}

func TestReadyzFollowsRedis(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	base := "http://" + c.HTTP.Addr
	waitStatus := func(path string, want int) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, body := httpGet(t, base+path)
			if code == want {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d %q, want %d", path, code, body, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	healthcheck := func() error {
		noEnv := func(string) string { return "" }
		return run(context.Background(), []string{"delayd", "healthcheck", "--set", "http.addr=" + c.HTTP.Addr}, noEnv, io.Discard, io.Discard)
	}
	waitStatus("/readyz", 200)
	if err := healthcheck(); err != nil {
		t.Errorf("healthcheck of a ready daemon: %v", err)
	}
	e.Redis.Kill()
	body := waitStatus("/readyz", 503)
	if !strings.Contains(body, "redis") {
		t.Errorf("readyz body gives no reason: %q", body)
	}
	if err := healthcheck(); exitCode(err, io.Discard) != 1 {
		t.Errorf("healthcheck while Redis is down: %v, want exit 1", err)
	}
	if code, _ := httpGet(t, base+"/livez"); code != 200 {
		t.Errorf("livez %d while Redis is down", code)
	}
	e.Redis.Start()
	waitStatus("/readyz", 200)
	if code, _ := httpGet(t, base+"/livez"); code != 200 {
		t.Errorf("livez %d", code)
	}
}

func TestInspectCLI(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	getenv := func(k string) string {
		if k == "DELAYD_NATS_URL" {
			return e.NATS.URL()
		}
		return ""
	}
	cli := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"delayd"}, args...), getenv, &out, &errOut)
		return out.String() + errOut.String(), err
	}
	for i := range 25 {
		target := "orders.cancel"
		if i%5 == 0 {
			target = "sms.send"
		}
		if _, err := cli("schedule", "--target", target, "--delay", fmt.Sprintf("%dm", 10+i), "--id", fmt.Sprintf("order-%d", i), "-H", "X-K:v", "payload"); err != nil {
			t.Fatal(err)
		}
	}
	out, err := cli("get", "order-7")
	if err != nil || !strings.Contains(out, "orders.cancel") || !strings.Contains(out, "pending") || !strings.Contains(out, "7 bytes") {
		t.Fatalf("get: %v\n%s", err, out)
	}
	out, err = cli("get", "--json", "order-7")
	var info client.Entry
	if err != nil || json.Unmarshal([]byte(out), &info) != nil || info.Header["X-K"][0] != "v" {
		t.Fatalf("get --json: %v %s", err, out)
	}
	if _, err := cli("get", "no-such-id"); exitCode(err, io.Discard) != 1 || !strings.Contains(err.Error(), "404") {
		t.Fatalf("get missing: %v", err)
	}

	// Page through everything, 7 at a time; every id once.
	seen := map[string]int{}
	cursor := ""
	for pages := 0; ; pages++ {
		args := []string{"list", "--json", "--limit", "7"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		out, err := cli(args...)
		var page client.Page
		if err != nil || json.Unmarshal([]byte(out), &page) != nil {
			t.Fatalf("list: %v %s", err, out)
		}
		if len(page.Entries) > 7 {
			t.Fatalf("page of %d over the limit", len(page.Entries))
		}
		for _, e := range page.Entries {
			seen[e.ID]++
		}
		if cursor = page.Next; cursor == "" {
			break
		}
		if pages > 20 {
			t.Fatal("paging does not end")
		}
	}
	if len(seen) != 25 {
		t.Fatalf("paged through %d ids, want 25", len(seen))
	}
	out, err = cli("list", "--json", "--target", "sms.>", "--limit", "1000")
	var sms client.Page
	if err != nil || json.Unmarshal([]byte(out), &sms) != nil || len(sms.Entries) != 5 {
		t.Fatalf("list --target: %v %s", err, out)
	}
	out, err = cli("list", "--json", "--due-before", time.Now().Add(14*time.Minute+30*time.Second).UTC().Format(time.RFC3339))
	var early client.Page
	if err != nil || json.Unmarshal([]byte(out), &early) != nil || len(early.Entries) != 5 {
		t.Fatalf("list --due-before: %v %s", err, out)
	}
	out, err = cli("list")
	if err != nil || !strings.Contains(out, "ID") || !strings.Contains(out, "order-") {
		t.Fatalf("list table: %v %s", err, out)
	}

	out, err = cli("stats", "--json")
	var st client.Stats
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.Pending != 25 || len(st.Shards) != c.Shards || st.NextDue == "" {
		t.Fatalf("stats: %v %s", err, out)
	}
	if out, err = cli("stats"); err != nil || !strings.Contains(out, "total") {
		t.Fatalf("stats table: %v %s", err, out)
	}
}
