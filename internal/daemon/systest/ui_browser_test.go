package systest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// browser starts headless chromium for one test, with a 60 s budget. It
// returns the page context and where screenshots go: the test's temp dir,
// or DELAYD_SCREENSHOTS to keep them.
func browser(t *testing.T, bin string) (context.Context, string) {
	t.Helper()
	dir := t.TempDir()
	shots := dir
	if d := os.Getenv("DELAYD_SCREENSHOTS"); d != "" {
		shots = d
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(bin), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(filepath.Join(dir, "profile")), chromedp.WindowSize(1280, 900))
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancel)
	return ctx, shots
}

// chromium finds Debian's chromium, or skips; under CI=true a missing
// browser fails the test (.ci/run installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found (CI=true)")
	}
	t.Skip("chromium not found")
	return ""
}

// TestConsoleInBrowser drives the console in real headless Chromium against
// a real daemon, Redis and NATS: the overview renders its charts with data,
// an envelope found by id is cancelled (and gone from Redis), and a dead
// letter is replayed and delivered. Each view is saved as a screenshot.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.UI.AllowActions = true
	c.UI.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	c.Targets.JetStream = []string{"uistream.>"}
	c.Scanner.MaxAttempts = 2
	c.Scanner.RetryBackoff = 50 * time.Millisecond
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	st := store.New(store.NewClient(store.Options{Addrs: c.Redis.Addrs}), c.Namespace, c.Shards)
	defer st.Close()

	// Data for every view: a spread of pending envelopes, some delivered,
	// one to cancel, one dead (a JetStream target without a stream yet).
	s := e.Sink(nc, "ui.delivered")
	for i := range 12 {
		daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "ui.delivered", "Delayd-Delay", "50ms", "Delayd-Id", "ui-d"+strconv.Itoa(i)))
	}
	for i, d := range []string{"30s", "3m", "10m", "30m", "2h", "12h", "30h", "100h", "300h"} {
		daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "ui.later", "Delayd-Delay", d, "Delayd-Id", "ui-p"+strconv.Itoa(i)))
	}
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "ui.later", "Delayd-Delay", "1h", "Delayd-Id", "ui-cancel-me", "X-Order", "42"))
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "uistream.orders", "Delayd-Delay", "10ms", "Delayd-Id", "ui-dead"))
	s.WaitCount(12, 5*time.Second)
	waitState(t, st, "ui-dead", store.StateDead, 10*time.Second)

	ctx, shots := browser(t, bin)
	// Accept the console's confirm() dialogs, from another goroutine: the
	// page waits for the answer, and so does the click that opened it.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	base := "http://" + c.UI.Addr + "/ui/"
	shot := func(name string) {
		t.Helper()
		buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		p := filepath.Join(shots, name+".png")
		if err := os.WriteFile(p, buf, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}
	count := func(expr string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return n
	}
	step := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	nonZero := func(chart string) string {
		return `document.querySelectorAll('` + chart + ` rect[data-value]:not([data-value="0"])').length`
	}

	// 1. Overview: charts render with data.
	step("overview",
		chromedp.Navigate(base+"#overview"),
		chromedp.WaitVisible(`#due-chart rect`))
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](nonZero("#lateness-chart")+` > 0`)); err != nil {
		t.Fatalf("lateness chart never showed data: %v", err)
	}
	dueBars, lateBars, shardRows := count(nonZero("#due-chart")), count(nonZero("#lateness-chart")), count(`document.querySelectorAll('#shards tbody tr').length`)
	shot("overview")
	if dueBars < 4 || lateBars < 1 || shardRows != c.Shards {
		t.Fatalf("overview charts: %d due bars, %d lateness bars, %d shard rows", dueBars, lateBars, shardRows)
	}

	// 2. Find by id, cancel with confirmation, gone from Redis.
	step("find",
		chromedp.Navigate(base+"#find"),
		chromedp.WaitVisible(`#find-id-input`),
		chromedp.SendKeys(`#find-id-input`, "ui-cancel-me"),
		chromedp.Click(`#find-id button`),
		chromedp.WaitVisible(`#cancel-btn`),
		chromedp.WaitVisible(`#payload-hidden`)) // ui.show_payloads is off by default
	shot("find")
	step("cancel", chromedp.Click(`#cancel-btn`), chromedp.WaitVisible(`#cancelled`))
	if _, err := st.Get(context.Background(), "ui-cancel-me"); err != store.ErrNotFound {
		t.Fatalf("cancelled in the console, still in Redis: %v", err)
	}

	// A dead envelope's page offers Replay and Purge, not Cancel.
	step("find dead",
		chromedp.Navigate(base+"#find"),
		chromedp.WaitVisible(`#find-id-input`),
		chromedp.SetValue(`#find-id-input`, "ui-dead"),
		chromedp.Click(`#find-id button`),
		chromedp.WaitVisible(`#replay-btn`),
		chromedp.WaitVisible(`#purge-btn`))
	if n := count(`document.querySelectorAll('#cancel-btn').length`); n != 0 {
		t.Fatal("a dead envelope's page offers Cancel")
	}

	// 3. Dead letters: replay once the stream exists; it is delivered.
	js := e.Stream("UISTREAM", "uistream.>")
	step("dead", chromedp.Navigate(base+"#dead"), chromedp.WaitVisible(`tr[data-id="ui-dead"]`))
	shot("dead")
	step("replay", chromedp.Click(`button.replay-one[data-id="ui-dead"]`))
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector('#dead-status').textContent.includes('replayed 1')`)); err != nil {
		t.Fatalf("replay status: %v", err)
	}
	testutil.Wait(t, 10*time.Second, "the replayed dead letter delivered", func() bool { return daemontest.StreamMsgs(t, js) == 1 })

	// 4. Targets.
	step("targets", chromedp.Navigate(base+"#targets"), chromedp.WaitVisible(`#targets-table tbody tr`))
	shot("targets")
}
