package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

func TestReadyzFollowsRedis(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	base := "http://" + c.HTTP.Addr
	waitStatus := func(path string, want int) string {
		t.Helper()
		var code int
		var body string
		if !testutil.Eventually(10*time.Second, func() bool {
			code, body = daemontest.HTTPGet(t, base+path)
			return code == want
		}) {
			t.Fatalf("%s: %d %q, want %d", path, code, body, want)
		}
		return body
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
	if code, _ := daemontest.HTTPGet(t, base+"/livez"); code != 200 {
		t.Errorf("livez %d while Redis is down", code)
	}
	e.Redis.Start()
	waitStatus("/readyz", 200)
	if code, _ := daemontest.HTTPGet(t, base+"/livez"); code != 200 {
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
