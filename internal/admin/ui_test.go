package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/flow"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

func uiServer(t *testing.T, opt UIOptions) (*httptest.Server, *store.Store) {
	t.Helper()
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "ui", 4)
	t.Cleanup(func() { st.Close() })
	if err := st.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The daemon always wires flow control, as here (a Control without a
	// Gate, as an intake's).
	opt.Flow = flow.NewControl(st, nil, nil)
	mux := http.NewServeMux()
	NewUI(st, NewMetrics("test", "all"), opt, hclog.NewNullLogger()).register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	var items []store.Item
	for i := range 30 {
		items = append(items, store.Item{ID: fmt.Sprintf("id-%02d", i), DelayMicros: int64(time.Duration(i+1) * time.Minute / time.Microsecond),
			Data: envelope.Encode(envelope.Envelope{Target: "orders.cancel", Payload: []byte("hello")})})
	}
	if _, errs := st.Schedule(context.Background(), items); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	return srv, st
}

func client(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar}
}

func do(t *testing.T, c *http.Client, method, url, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func session(t *testing.T, c *http.Client, base string, hdr map[string]string) string {
	t.Helper()
	code, body := do(t, c, "GET", base+"/ui/api/session", "", hdr)
	if code != 200 {
		t.Fatalf("session %d %s", code, body)
	}
	var s struct{ CSRF string }
	_ = json.Unmarshal([]byte(body), &s)
	return s.CSRF
}

func TestUIReadOnlyByDefault(t *testing.T) {
	srv, st := uiServer(t, UIOptions{})
	c := client(t)
	for _, path := range []string{"/ui/", "/ui/app.js", "/ui/style.css", "/ui/api/overview", "/ui/api/targets", "/ui/api/list", "/ui/api/envelope?id=id-03"} {
		if code, body := do(t, c, "GET", srv.URL+path, "", nil); code != 200 {
			t.Errorf("GET %s: %d %s", path, code, body)
		}
	}
	if code, _ := do(t, c, "GET", srv.URL+"/ui/api/envelope?id=nope", "", nil); code != 404 {
		t.Errorf("missing envelope: %d", code)
	}
	csrf := session(t, c, srv.URL, nil)
	code, _ := do(t, c, "POST", srv.URL+"/ui/api/cancel", `{"id":"id-03"}`, map[string]string{"X-CSRF-Token": csrf})
	if code != http.StatusForbidden {
		t.Fatalf("cancel on a read-only console: %d", code)
	}
	if _, err := st.Get(context.Background(), "id-03"); err != nil {
		t.Fatal("read-only console changed Redis")
	}
}

func TestUIActionsNeedCSRF(t *testing.T) {
	srv, st := uiServer(t, UIOptions{AllowActions: true})
	c := client(t)
	if code, _ := do(t, c, "POST", srv.URL+"/ui/api/cancel", `{"id":"id-01"}`, nil); code != http.StatusForbidden {
		t.Fatalf("cancel without a CSRF token: %d", code)
	}
	csrf := session(t, c, srv.URL, nil)
	if code, _ := do(t, c, "POST", srv.URL+"/ui/api/cancel", `{"id":"id-01"}`, map[string]string{"X-CSRF-Token": "wrong"}); code != http.StatusForbidden {
		t.Fatalf("cancel with a wrong token: %d", code)
	}
	code, body := do(t, c, "POST", srv.URL+"/ui/api/cancel", `{"id":"id-01"}`, map[string]string{"X-CSRF-Token": csrf})
	if code != 200 || !strings.Contains(body, `"cancelled":true`) {
		t.Fatalf("cancel: %d %s", code, body)
	}
	if _, err := st.Get(context.Background(), "id-01"); err != store.ErrNotFound {
		t.Fatalf("cancelled envelope still stored: %v", err)
	}
	if code, _ := do(t, c, "POST", srv.URL+"/ui/api/replay", `{"ids":[]}`, map[string]string{"X-CSRF-Token": csrf}); code != 400 {
		t.Fatalf("replay without ids: %d", code)
	}
}

func TestUIAuth(t *testing.T) {
	srv, _ := uiServer(t, UIOptions{BasicUser: "ops", BasicPass: "pw", BearerToken: "tok"})
	c := client(t)
	if code, _ := do(t, c, "GET", srv.URL+"/ui/api/overview", "", nil); code != 401 {
		t.Fatalf("no credentials: %d", code)
	}
	if code, _ := do(t, c, "GET", srv.URL+"/ui/", "", map[string]string{"Authorization": "Bearer nope"}); code != 401 {
		t.Fatalf("wrong token: %d", code)
	}
	if code, _ := do(t, c, "GET", srv.URL+"/ui/api/overview", "", map[string]string{"Authorization": "Bearer tok"}); code != 200 {
		t.Fatalf("bearer token: %d", code)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/ui/api/overview", nil)
	req.SetBasicAuth("ops", "pw")
	if resp, err := c.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("basic auth: %v %v", err, resp.StatusCode)
	}
}

func TestUIListPaging(t *testing.T) {
	srv, _ := uiServer(t, UIOptions{})
	c := client(t)
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; pages < 20; pages++ {
		url := srv.URL + "/ui/api/list?limit=7"
		if cursor != "" {
			url += "&cursor=" + cursor
		}
		code, body := do(t, c, "GET", url, "", nil)
		var page struct {
			Entries []entryView
			Next    string
		}
		if code != 200 || json.Unmarshal([]byte(body), &page) != nil || len(page.Entries) > 7 {
			t.Fatalf("list: %d %s", code, body)
		}
		for _, e := range page.Entries {
			seen[e.ID] = true
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	if len(seen) != 30 {
		t.Fatalf("paged through %d of 30", len(seen))
	}
	before := time.Now().Add(10*time.Minute + 30*time.Second).UTC().Format(time.RFC3339)
	_, body := do(t, c, "GET", srv.URL+"/ui/api/list?limit=100&due_before="+before, "", nil)
	if n := strings.Count(body, `"id"`); n != 10 {
		t.Fatalf("due_before: %d entries", n)
	}
	if code, _ := do(t, c, "GET", srv.URL+"/ui/api/list?target=a..b", "", nil); code != 400 {
		t.Fatalf("bad target pattern: %d", code)
	}
	_, body = do(t, c, "GET", srv.URL+"/ui/api/overview", "", nil)
	if !strings.Contains(body, `"pending":30`) || !strings.Contains(body, `"label":"1–5 min"`) {
		t.Fatalf("overview: %s", body)
	}
}

// Due times in the console have one width: three fraction digits always.
func TestConsoleTimeHasOneWidth(t *testing.T) {
	for ms, want := range map[int64]string{
		1_000:             "1970-01-01T00:00:01.000Z",
		1_796_118_690_554: "2026-12-01T09:51:30.554Z",
		1_796_118_690_500: "2026-12-01T09:51:30.500Z",
	} {
		if got := consoleTime(ms); got != want {
			t.Errorf("consoleTime(%d) = %q, want %q", ms, got, want)
		}
	}
}
