package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/admin"
	"github.com/delayd/delayd/internal/flow"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

const (
	alertsFile      = "monitoring/delayd-alerts.yaml"
	alertsTestFile  = "monitoring/delayd-alerts_test.yaml"
	chartAlertsFile = "helm/delayd/files/delayd-alerts.yaml"
	dashboardFile   = "monitoring/delayd-dashboard.json"
)

func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool := tool(t, "promtool", "apt-get install prometheus")
	run(t, promtool, "check", "rules", alertsFile)
	run(t, promtool, "test", "rules", alertsTestFile)
	// The chart's PrometheusRule is rendered from its own copy.
	a, _ := os.ReadFile(alertsFile)
	b, _ := os.ReadFile(chartAlertsFile)
	if !bytes.Equal(a, b) {
		t.Errorf("%s differs from %s: cp %[2]s %[1]s", chartAlertsFile, alertsFile)
	}
}

// exportedMetrics scrapes a metrics registry the way Prometheus would,
// with every gauge set: the sampler runs once as the owner of shard 0
// against a throwaway Redis.
func exportedMetrics(t *testing.T) []string {
	t.Helper()
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "metrics", 4)
	defer st.Close()
	m := admin.NewMetrics("test", "all")
	m.WatchNATS(func() bool { return true })
	m.WatchEvictionGuard(func() string { return store.GuardOn })
	// Counted per rule pattern, so only once there is one.
	m.Held("a.>", "limit", 1)
	m.Allowed("a.>", time.Millisecond)
	m.WatchFlow(func() []flow.Status {
		return []flow.Status{{Pattern: "a.>", Rate: "1/s", Burst: 1, PausedSince: time.Now(),
			FlowHeld: store.FlowHeld{Limited: 1, Parked: 1, BacklogMs: 1000, Rate: 1}}}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		m.Sample(ctx, st, func() []int { return []int{0} }, time.Hour, hclog.NewNullLogger())
		close(done)
	}()
	defer func() { cancel(); <-done }()
	var names []string
	// The sample sets the owners' gauge before the flow gauges: wait for
	// both, or a scrape between them misses the flow metrics.
	testutil.Wait(t, 10*time.Second, "the first sample exports delayd_shards_unowned and delayd_flow_rate", func() bool {
		fams, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		names = nil
		for _, f := range fams {
			n := f.GetName()
			names = append(names, n)
			if f.GetType().String() == "HISTOGRAM" {
				names = append(names, n+"_bucket", n+"_sum", n+"_count")
			}
		}
		return slices.Contains(names, "delayd_shards_unowned") && slices.Contains(names, "delayd_flow_rate")
	})
	return names
}

// metricRef finds metric names in PromQL: identifiers followed by a
// selector, a range or the end of an aggregation's argument.
var metricRef = regexp.MustCompile(`\b((?:delayd|process|go)_[a-z0-9_]+)\b`)

func TestDashboardAndRulesNameRealMetrics(t *testing.T) {
	t.Parallel()
	names := exportedMetrics(t)
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.UID == "" || len(dash.Panels) < 8 {
		t.Fatalf("dashboard uid %q with %d panels", dash.UID, len(dash.Panels))
	}
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	rules, _ := os.ReadFile(alertsFile)
	for _, line := range strings.Split(string(rules), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			exprs = append(exprs, line)
		}
	}
	used := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricRef.FindAllStringSubmatch(e, -1) {
			used[m[1]] = true
			if !slices.Contains(names, m[1]) {
				t.Errorf("%q names %s, which delayd does not export", e, m[1])
			}
		}
	}
	// Every delayd metric is on the dashboard or in an alert.
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
		if strings.HasPrefix(n, "delayd_") && !used[n] && !used[base+"_bucket"] && !used[base] {
			t.Errorf("metric %s is neither on the dashboard nor in an alert", n)
		}
	}
}
