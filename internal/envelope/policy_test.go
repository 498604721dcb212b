package envelope

import (
	"strings"
	"testing"
	"time"
)

// TestPolicyBuiltinDeny covers every namespace issue 11 names, case
// variants and trailing tokens.
func TestPolicyBuiltinDeny(t *testing.T) {
	p := Policy{Prefix: "delayd"}
	for _, tc := range []struct {
		target string
		rule   string // "" = allowed
	}{
		// Every $ space, known and future, with and without trailing tokens.
		{"$SYS.REQ.SERVER.PING", "$*"}, {"$SYS", "$*"}, {"$JS.API.STREAM.DELETE.X", "$*"},
		{"$JS.ACK.s.c.1.2.3.4.5", "$*"}, {"$JSC.CI.x.y", "$*"}, {"$KV.b.k", "$*"}, {"$O.b.C.x", "$*"},
		{"$SRV.PING", "$*"}, {"$MQTT.rmsgs", "$*"}, {"$MQTT.sess.abc", "$*"}, {"$MQTT.JSA.x.RM.y", "$*"},
		{"$NRG.AE.x", "$*"}, {"$G", "$*"}, {"$G.x", "$*"}, {"$NEXT.thing", "$*"}, {"$", "$*"},
		// Case variants are still $ subjects.
		{"$sys.req", "$*"}, {"$Mqtt.rmsgs", "$*"}, {"$kv.b.k", "$*"},
		// Reply spaces, any case, any depth, even the bare token.
		{"_INBOX.abc", "_INBOX*.>"}, {"_INBOX.abc.def.1", "_INBOX*.>"}, {"_INBOX", "_INBOX*.>"}, {"_inbox.abc", "_INBOX*.>"},
		{"_INBOX_orders.abc", "_INBOX*.>"}, {"_INBOXES.x", "_INBOX*.>"},
		{"_R_.abc", "_R_.>"}, {"_R_.a.b.c", "_R_.>"}, {"_r_.x", "_R_.>"}, {"_R_", "_R_.>"},
		// delayd's own subjects, any case, the bare prefix too.
		{"delayd.schedule", "delayd.>"}, {"delayd.admin.get", "delayd.>"}, {"delayd.internal.wake.3", "delayd.>"},
		{"delayd", "delayd.>"}, {"DELAYD.schedule", "delayd.>"}, {"Delayd.cancel", "delayd.>"},
		// Look-alikes that are ordinary subjects.
		{"delaydx.schedule", ""}, {"orders.delayd", ""}, {"orders.$SYS", ""}, {"a._INBOX.x", ""},
		{"_R.x", ""}, {"orders.cancel", ""}, {"SYS.x", ""},
	} {
		err := p.Check(tc.target)
		if tc.rule == "" {
			if err != nil {
				t.Errorf("%s: refused: %v", tc.target, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: allowed, want refused by %s", tc.target, tc.rule)
			continue
		}
		if CodeOf(err) != CodeForbidden || !strings.Contains(err.Error(), "built-in rule "+tc.rule+" ") {
			t.Errorf("%s: %v (code %d), want 403 naming %s", tc.target, err, CodeOf(err), tc.rule)
		}
	}
}

// TestPolicyPrecedence: built-in deny, then explicit allow, then user deny.
func TestPolicyPrecedence(t *testing.T) {
	p := Policy{
		Prefix: "svc.delayd",
		Allow:  []string{"$KV.orders.>", "orders.>", ">", "*.>", "_INBOX.>", "svc.delayd.>", "$JS.API.*"},
		Deny:   []string{"$KV.orders.secret", "orders.internal.>"},
	}
	for _, tc := range []struct {
		target, want string // want: "" allowed, else a part of the message
	}{
		{"$KV.orders.o1", ""}, // opened by an allow naming $KV
		{"$KV.orders.secret", `targets.deny "$KV.orders.secret"`}, // user deny wins over allow
		{"$KV.other.k", "built-in rule $*"},                       // ">" and "*.>" never open a $ subject
		{"$kv.orders.o1", "built-in rule $*"},                     // opening is literal, case included
		{"$JS.API.INFO", ""},                                      // a literal first token opens, wildcards after it are fine
		{"$SYS.REQ.x", "built-in rule $*"},
		{"_INBOX.abc", "built-in rule _INBOX*.>"}, // never opened
		{"svc.delayd.schedule", "built-in rule svc.delayd.>"},
		{"svc.other", ""},
		{"orders.cancel", ""},
		{"orders.internal.x", `targets.deny "orders.internal.>"`},
	} {
		err := p.Check(tc.target)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.target, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want refusal naming %s", tc.target, err, tc.want)
		}
	}
	only := Policy{Prefix: "delayd", Allow: []string{"orders.>"}}
	if err := only.Check("payments.x"); err == nil || !strings.Contains(err.Error(), "targets.allow") {
		t.Errorf("not in allow: %v", err)
	}
}

func TestNATSHeadersRefused(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	base := func(k, v string) map[string][]string {
		return map[string][]string{"Delayd-Target": {"a.b"}, "Delayd-Delay": {"1m"}, k: {v}}
	}
	allow := Policy{Prefix: "delayd", AllowNATS: []string{"nats-ttl"}}
	for _, tc := range []struct {
		pol    Policy
		header string
		code   int
	}{
		{pol, "Nats-Rollup", 400}, {pol, "nats-rollup", 400}, {pol, "NATS-MSG-ID", 400}, {pol, "Nats-Msg-Id", 400},
		{pol, "Nats-Expected-Last-Subject-Sequence", 400}, {pol, "Nats-Expected-Stream", 400}, {pol, "Nats-TTL", 400},
		{pol, "Nats-Schedule", 400}, // not interpreted (yet): refused like the rest
		{allow, "Nats-TTL", 0}, {allow, "NATS-ttl", 0}, {allow, "Nats-Rollup", 400},
		{pol, "Natsy", 0}, {pol, "Nats", 0}, {pol, "X-Nats-Thing", 0}, {pol, "traceparent", 0},
	} {
		_, err := ParseSchedule(base(tc.header, "v"), nil, lim, tc.pol, now)
		if got := codeOrZero(err); got != tc.code {
			t.Errorf("%s (allow_nats %v): code %d (%v), want %d", tc.header, tc.pol.AllowNATS, got, err, tc.code)
		}
	}
}

func codeOrZero(err error) int {
	if err == nil {
		return 0
	}
	return CodeOf(err)
}

func TestRedactHeaders(t *testing.T) {
	h := map[string][]string{"Authorization": {"Bearer x"}, "x-api-key": {"k1", "k2"}, "traceparent": {"00-1"}}
	got := RedactHeaders(h, []string{"authorization", "X-Api-Key"})
	if got["Authorization"][0] != Redacted || got["x-api-key"][1] != Redacted || got["traceparent"][0] != "00-1" {
		t.Errorf("redacted: %v", got)
	}
	if h["Authorization"][0] != "Bearer x" {
		t.Error("RedactHeaders changed its input")
	}
}
