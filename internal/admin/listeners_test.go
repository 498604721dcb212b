package admin

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

var defaultRedact = []string{"Authorization", "Cookie", "Set-Cookie", "Proxy-Authorization", "X-Api-Key"}

// secretEnvelope stores an envelope whose headers and payload carry what an
// attacker wants: a bearer token, a cookie, an API key and a card number.
func secretEnvelope(t *testing.T, st *store.Store) {
	t.Helper()
	env := envelope.Envelope{Target: "orders.cancel", Payload: []byte("card 4111111111111111"), Header: map[string][]string{
		"Authorization": {"Bearer s3cret-token"}, "Cookie": {"session=c00kie"}, "x-api-key": {"k3y"}, "Traceparent": {"00-trace-01"},
	}}
	if _, errs := st.Schedule(context.Background(), []store.Item{{ID: "secret", DelayMicros: 3.6e9, Data: envelope.Encode(env)}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func serve(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// TestTwoListeners makes real requests to both listeners: probes and
// metrics on one, the console only on the other, whose URL is logged.
func TestTwoListeners(t *testing.T) {
	_, st := uiServer(t, UIOptions{})
	secretEnvelope(t, st)
	m := NewMetrics("test", "all")
	var logs syncBuf
	log := hclog.New(&hclog.LoggerOptions{Output: &logs})
	probes, err := Listen("127.0.0.1:0", m, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	console, err := ListenUI("127.0.0.1:0", NewUI(st, m, UIOptions{RedactHeaders: defaultRedact}, log), log)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, probes)
	serve(t, console)
	c := client(t)
	for _, path := range []string{"/livez", "/readyz", "/metrics"} {
		if code, _ := do(t, c, "GET", probes.URL()+path, "", nil); code != 200 {
			t.Errorf("probes %s: %d", path, code)
		}
		if code, _ := do(t, c, "GET", console.URL()+path, "", nil); code != 404 {
			t.Errorf("console listener serves %s: %d", path, code)
		}
	}
	for _, path := range []string{"/ui/", "/ui/api/envelope?id=secret", "/ui/api/overview", "/ui/api/list"} {
		if code, _ := do(t, c, "GET", probes.URL()+path, "", nil); code != 404 {
			t.Errorf("probe listener serves %s: %d", path, code)
		}
		if code, _ := do(t, c, "GET", console.URL()+path, "", nil); code != 200 {
			t.Errorf("console %s: %d", path, code)
		}
	}
	// Run logs before it serves, and the requests above were answered.
	if !strings.Contains(logs.String(), "console at "+console.URL()+"/ui/") {
		t.Fatalf("console URL not logged:\n%s", logs.String())
	}
	// DNS rebinding: a page whose name now points at 127.0.0.1 sends its
	// own Host; the loopback console answers only to loopback names.
	for host, want := range map[string]int{"evil.example": 421, "evil.example:9480": 421, "localhost": 200, "[::1]:9480": 200} {
		req, _ := http.NewRequest("GET", console.URL()+"/ui/api/list", nil)
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// TestConsoleHidesPayloadsByDefault: without ui.show_payloads the console
// shows sizes and header names, no values and no payload; with it, the
// redacted headers still never show their values.
func TestConsoleHidesPayloadsByDefault(t *testing.T) {
	for _, show := range []bool{false, true} {
		srv, st := uiServer(t, UIOptions{ShowPayloads: show, RedactHeaders: defaultRedact})
		secretEnvelope(t, st)
		code, body := do(t, client(t), "GET", srv.URL+"/ui/api/envelope?id=secret", "", nil)
		if code != 200 {
			t.Fatalf("show_payloads=%v: %d %s", show, code, body)
		}
		for _, secret := range []string{"s3cret", "c00kie", "k3y"} {
			if strings.Contains(body, secret) {
				t.Errorf("show_payloads=%v: redacted header value %q shown: %s", show, secret, body)
			}
		}
		for _, name := range []string{"Authorization", "Cookie", "x-api-key", "Traceparent", `"size":21`} {
			if !strings.Contains(body, name) {
				t.Errorf("show_payloads=%v: %s missing: %s", show, name, body)
			}
		}
		payload, trace := strings.Contains(body, "4111111111111111"), strings.Contains(body, "00-trace-01")
		if payload != show || trace != show {
			t.Errorf("show_payloads=%v: payload shown %v, traceparent value shown %v: %s", show, payload, trace, body)
		}
		if show && !strings.Contains(body, envelope.Redacted) {
			t.Errorf("redacted headers not marked: %s", body)
		}
	}
}

// TestProbesAloneServeNoConsole: http.addr has no /ui whatever the request.
func TestProbesAloneServeNoConsole(t *testing.T) {
	probes, err := Listen("127.0.0.1:0", NewMetrics("test", "all"), nil, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	serve(t, probes)
	for _, m := range []string{"GET", "POST"} {
		code, _ := do(t, client(t), m, probes.URL()+"/ui/api/cancel", `{"id":"x"}`, nil)
		if code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
			t.Errorf("%s /ui/api/cancel on the probe listener: %d", m, code)
		}
	}
}
