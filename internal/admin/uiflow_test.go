package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

type flowPage struct {
	Available bool       `json:"available"`
	Rules     []flowView `json:"rules"`
}

func flowRules(t *testing.T, c *http.Client, base string) flowPage {
	t.Helper()
	code, body := do(t, c, "GET", base+"/ui/api/flow", "", nil)
	var p flowPage
	if code != 200 || json.Unmarshal([]byte(body), &p) != nil {
		t.Fatalf("flow: %d %s", code, body)
	}
	return p
}

func TestUIFlowLimits(t *testing.T) {
	srv, _ := uiServer(t, UIOptions{AllowActions: true})
	c := client(t)
	if p := flowRules(t, c, srv.URL); !p.Available || len(p.Rules) != 0 {
		t.Fatalf("no rules yet: %+v", p)
	}
	csrf := map[string]string{"X-CSRF-Token": session(t, c, srv.URL, nil)}
	for _, bad := range []string{
		`{"pattern":"orders.>","rate":"fast"}`,
		`{"pattern":"orders.>","rate":"500/s","burst":-1}`,
		`{"pattern":"a..b","rate":"500/s"}`,
		`{"pattern":"orders.>"}`,
		`not json`,
	} {
		if code, body := do(t, c, "POST", srv.URL+"/ui/api/limit", bad, csrf); code != 400 {
			t.Errorf("limit %s: %d %s, want 400", bad, code, body)
		}
	}
	if code, body := do(t, c, "POST", srv.URL+"/ui/api/limit", `{"pattern":"orders.>","rate":"fast"}`, csrf); !strings.Contains(body, "want a whole number") {
		t.Errorf("a bad rate says why: %d %s", code, body)
	}
	code, body := do(t, c, "POST", srv.URL+"/ui/api/limit", `{"pattern":"orders.>","rate":"500/s","burst":50}`, csrf)
	if code != 200 || !strings.Contains(body, `"rate":"500/s"`) || !strings.Contains(body, `"burst":50`) {
		t.Fatalf("limit: %d %s", code, body)
	}
	p := flowRules(t, c, srv.URL)
	if len(p.Rules) != 1 || p.Rules[0].Pattern != "orders.>" || p.Rules[0].Rate != "500/s" || p.Rules[0].Burst != 50 ||
		p.Rules[0].PausedSince != "" || p.Rules[0].DrainSeconds == nil || *p.Rules[0].DrainSeconds != 0 {
		t.Fatalf("rules after limit: %+v", p.Rules)
	}
	code, body = do(t, c, "POST", srv.URL+"/ui/api/limit", `{"pattern":"orders.>","rate":"off"}`, csrf)
	if code != 200 || !strings.Contains(body, `"existed":true`) || !strings.Contains(body, `"released":0`) {
		t.Fatalf("limit off: %d %s", code, body)
	}
	if p := flowRules(t, c, srv.URL); len(p.Rules) != 0 {
		t.Fatalf("rules after off: %+v", p.Rules)
	}
}

// A pause made in the console holds a parked envelope, shown as paused,
// until the console's resume releases it.
func TestUIFlowPauseResume(t *testing.T) {
	srv, st := uiServer(t, UIOptions{AllowActions: true})
	ctx := context.Background()
	c := client(t)
	csrf := map[string]string{"X-CSRF-Token": session(t, c, srv.URL, nil)}
	code, body := do(t, c, "POST", srv.URL+"/ui/api/pause", `{"pattern":"orders.>"}`, csrf)
	if code != 200 || !strings.Contains(body, `"paused_since":"20`) {
		t.Fatalf("pause: %d %s", code, body)
	}
	// Park one envelope as the Gate does when its owner claims it.
	if _, errs := st.Schedule(ctx, []store.Item{{ID: "held", Data: envelope.Encode(envelope.Envelope{Target: "orders.new", Payload: []byte("x")})}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	time.Sleep(2 * time.Millisecond) // due now is claimable from the next ms
	res, err := st.Claim(ctx, []int{st.Shard("held")}, store.ClaimOptions{Batch: 10, Lease: time.Minute})
	if err != nil || len(res) != 1 || len(res[0].Items) != 1 {
		t.Fatalf("claim: %+v %v", res, err)
	}
	cl := res[0].Items[0]
	if err := st.Park(ctx, "orders.>", []string{cl.ID}, []int64{cl.DueMs}, []string{""}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Ack(ctx, map[int][]store.Settle{st.Shard(cl.ID): {{ID: cl.ID, Token: cl.Token, Outcome: store.Hold, HoldUntilMs: store.ParkedBase + cl.DueMs}}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, body := do(t, c, "GET", srv.URL+"/ui/api/envelope?id=held", "", nil); !strings.Contains(body, `"state":"paused"`) {
		t.Fatalf("a parked envelope reads %s", body)
	}
	if _, body := do(t, c, "GET", srv.URL+"/ui/api/list?target=orders.new", "", nil); !strings.Contains(body, `"state":"paused"`) {
		t.Fatalf("list of a parked envelope: %s", body)
	}
	p := flowRules(t, c, srv.URL)
	if len(p.Rules) != 1 || p.Rules[0].PausedSince == "" || p.Rules[0].Parked != 1 || p.Rules[0].DrainSeconds != nil {
		t.Fatalf("rules while paused: %+v", p.Rules)
	}
	code, body = do(t, c, "POST", srv.URL+"/ui/api/resume", `{"pattern":"orders.>"}`, csrf)
	if code != 200 || !strings.Contains(body, `"existed":true`) || !strings.Contains(body, `"released":1`) {
		t.Fatalf("resume: %d %s", code, body)
	}
	if e, err := st.Get(ctx, "held"); err != nil || e.State != store.StatePending {
		t.Fatalf("after resume: %+v %v", e, err)
	}
	if p := flowRules(t, c, srv.URL); len(p.Rules) != 0 {
		t.Fatalf("rules after resume: %+v", p.Rules)
	}
	if code, _ := do(t, c, "POST", srv.URL+"/ui/api/pause", `{}`, csrf); code != 400 {
		t.Fatalf("pause without a pattern: %d", code)
	}
	st.Close()
	if code, _ := do(t, c, "GET", srv.URL+"/ui/api/flow", "", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("flow with Redis gone: %d", code)
	}
	if code, _ := do(t, c, "POST", srv.URL+"/ui/api/pause", `{"pattern":"orders.>"}`, csrf); code != http.StatusServiceUnavailable {
		t.Fatalf("pause with Redis gone: %d", code)
	}
}

// Flow-control changes are guarded as cancel is: read-only refuses them,
// and so do a missing CSRF token and missing credentials.
func TestUIFlowGuarded(t *testing.T) {
	changes := map[string]string{
		"limit": `{"pattern":"orders.>","rate":"5/s"}`, "pause": `{"pattern":"orders.>"}`, "resume": `{"pattern":"orders.>"}`,
	}
	ro, _ := uiServer(t, UIOptions{})
	c := client(t)
	csrf := map[string]string{"X-CSRF-Token": session(t, c, ro.URL, nil)}
	for path, body := range changes {
		if code, _ := do(t, c, "POST", ro.URL+"/ui/api/"+path, body, csrf); code != http.StatusForbidden {
			t.Errorf("%s on a read-only console: %d", path, code)
		}
	}
	if p := flowRules(t, c, ro.URL); len(p.Rules) != 0 {
		t.Fatalf("a read-only console changed the rules: %+v", p.Rules)
	}

	srv, _ := uiServer(t, UIOptions{AllowActions: true, BearerToken: "tok"})
	auth := map[string]string{"Authorization": "Bearer tok"}
	csrf = map[string]string{"X-CSRF-Token": session(t, c, srv.URL, auth)}
	for path, body := range changes {
		if code, _ := do(t, c, "POST", srv.URL+"/ui/api/"+path, body, csrf); code != http.StatusUnauthorized {
			t.Errorf("%s without credentials: %d", path, code)
		}
		if code, _ := do(t, c, "POST", srv.URL+"/ui/api/"+path, body, auth); code != http.StatusForbidden {
			t.Errorf("%s without a CSRF token: %d", path, code)
		}
	}
	if code, _ := do(t, c, "GET", srv.URL+"/ui/api/flow", "", nil); code != http.StatusUnauthorized {
		t.Errorf("flow without credentials: %d", code)
	}
}

// A daemon without flow control says so.
func TestUIFlowUnavailable(t *testing.T) {
	mux := http.NewServeMux()
	var st *store.Store // not called
	NewUI(st, nil, UIOptions{AllowActions: true}, hclog.NewNullLogger()).register(mux)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/api/flow", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"available":false`) {
		t.Fatalf("flow without flow control: %d %s", rec.Code, rec.Body)
	}
}

// The page has the flow-control panel, and names the paused state.
func TestUIPageHasFlowPanel(t *testing.T) {
	for file, want := range map[string][]string{
		"ui/index.html": {`id="view-flow"`, `href="#flow"`, `id="flow-table"`, `id="limit-form"`, `id="pause-form"`},
		"ui/app.js":     {`api("flow")`, `flowAction("limit"`, `flowAction("pause"`, `flowAction("resume"`, `paused:`},
	} {
		b, err := uiFiles.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s lacks %s", file, w)
			}
		}
	}
}
