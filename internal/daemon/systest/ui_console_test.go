package systest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// chartLayout lists chart labels that stick out of their chart or overlap
// another label, as the browser lays them out.
const chartLayout = `(() => {
  const bad = [];
  for (const svg of document.querySelectorAll('svg.chart')) {
    const box = svg.getBoundingClientRect();
    const ts = [...svg.querySelectorAll('text')];
    const rs = ts.map((t) => t.getBoundingClientRect());
    rs.forEach((r, i) => {
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5)
        bad.push(svg.id + ': "' + ts[i].textContent + '" clipped');
      for (let j = i + 1; j < rs.length; j++) {
        const q = rs[j];
        if (r.left < q.right && q.left < r.right && r.top < q.bottom && q.top < r.bottom)
          bad.push(svg.id + ': "' + ts[i].textContent + '" overlaps "' + ts[j].textContent + '"');
      }
    });
    if (ts.length < 3) bad.push(svg.id + ': ' + ts.length + ' labels');
  }
  return bad.join('; ');
})()`

// TestConsoleReadOnlyInBrowser drives a read-only console in headless
// Chromium: chart labels neither overlap nor get clipped, "Updated" is
// UTC, Find starts with an empty state, Browse lists envelopes by due
// time across shards, and disabled actions say why.
func TestConsoleReadOnlyInBrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.UI.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	c.Targets.JetStream = []string{"uistream.>"}
	c.Scanner.MaxAttempts = 1
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	// Delays out of order of ids, so id or shard order would show.
	for i, d := range []string{"30m", "3m", "2h", "10m", "30s", "12h", "1h", "100h", "5m", "300h"} {
		daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "ui.later", "Delayd-Delay", d, "Delayd-Id", "ro-"+strconv.Itoa(i)))
	}
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "uistream.orders", "Delayd-Delay", "10ms", "Delayd-Id", "ro-dead"))

	ctx, shots := browser(t, bin)
	base := "http://" + c.UI.Addr + "/ui/"
	step := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
	shot := func(name string) {
		t.Helper()
		buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), buf, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// Overview: labels laid out cleanly, times in UTC.
	step("overview", chromedp.Navigate(base+"#overview"), chromedp.WaitVisible(`#rate-chart text`))
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector('#updated').textContent.endsWith('UTC')`)); err != nil {
		t.Errorf(`"Updated" is not UTC: %q`, eval(`document.querySelector('#updated').textContent`))
	}
	shot("readonly-overview")
	if bad := eval(chartLayout); bad != "" {
		t.Errorf("chart labels: %s", bad)
	}
	now := time.Now().UTC()
	for _, label := range strings.Split(eval(`[...document.querySelectorAll('#rate-chart text.axis')].map((t) => t.textContent).join(',')`), ",") {
		lt, err := time.Parse("15:04:05", label)
		if err != nil {
			t.Fatalf("rate label %q: %v", label, err)
		}
		// Seconds from now to the label on a clock face: a chart that spans
		// midnight has labels of the day before.
		off := ((lt.Hour()*60+lt.Minute())*60 - (now.Hour()*60+now.Minute())*60) % 86400
		switch {
		case off > 43200:
			off -= 86400
		case off <= -43200:
			off += 86400
		}
		if off > 60 || off < -6*60 {
			t.Errorf("rate label %q is not UTC (now %s)", label, now.Format("15:04:05"))
		}
	}
	if mode := eval(`document.querySelector('#mode').textContent`); !strings.Contains(mode, "ui.allow_actions") {
		t.Errorf("mode %q does not say what makes it read-only", mode)
	}

	// Find: an empty state first, then Browse in due order.
	step("find", chromedp.Navigate(base+"#find"), chromedp.WaitVisible(`#find-empty`))
	shot("readonly-find")
	step("browse", chromedp.Click(`#browse button`), chromedp.WaitVisible(`#browse-results tbody tr`))
	if hidden := eval(`String(document.querySelector('#find-empty').hidden)`); hidden != "true" {
		t.Error("empty state still shown after browsing")
	}
	dues := strings.Split(eval(`[...document.querySelectorAll('#browse-results tbody tr td:nth-child(2)')].map((td) => td.textContent).join(',')`), ",")
	var times []time.Time
	for _, d := range dues {
		tm, err := time.Parse(time.RFC3339Nano, d)
		if err != nil {
			t.Fatalf("browse due %q: %v", d, err)
		}
		times = append(times, tm)
	}
	if len(times) != 10 || !slices.IsSortedFunc(times, func(a, b time.Time) int { return a.Compare(b) }) {
		t.Errorf("browse is not in due order: %v", dues)
	}
	shot("readonly-browse")

	// A disabled action says why.
	step("detail", chromedp.Click(`#browse-results tbody tr a`), chromedp.WaitVisible(`#cancel-btn`))
	if title := eval(`document.querySelector('#cancel-btn').disabled + ' ' + document.querySelector('#cancel-btn').title`); !strings.HasPrefix(title, "true ") || !strings.Contains(title, "ui.allow_actions") {
		t.Errorf("disabled cancel button: %q", title)
	}
	step("dead", chromedp.Navigate(base+"#dead"), chromedp.WaitVisible(`tr[data-id="ro-dead"]`), chromedp.WaitVisible(`#dead-read-only`))
	if title := eval(`document.querySelector('button.replay-one').disabled + ' ' + document.querySelector('button.replay-one').title`); !strings.HasPrefix(title, "true ") || !strings.Contains(title, "ui.allow_actions") {
		t.Errorf("disabled replay button: %q", title)
	}
	shot("readonly-dead")
}
