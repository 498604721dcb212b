package envelope

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

var lim = Limits{MaxPayload: 100, MaxIDLen: 16, MaxHeaders: 4, MaxHeaderBytes: 200, MaxDelay: time.Hour, MaxPast: time.Minute}

var pol = Policy{Prefix: "delayd"}

func TestParseSchedule(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	h := func(kv ...string) map[string][]string {
		m := map[string][]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = append(m[kv[i]], kv[i+1])
		}
		return m
	}
	cases := []struct {
		name    string
		h       map[string][]string
		payload string
		code    int // 0 = ok
	}{
		{"delay", h("Delayd-Target", "a.b", "Delayd-Delay", "30m"), "x", 0},
		{"at with fraction", h("Delayd-Target", "a.b", "Delayd-At", "2026-11-30T10:00:00.250Z"), "", 0},
		{"lowercase control headers", h("delayd-target", "a.b", "DELAYD-DELAY", "1s"), "", 0},
		{"zero delay", h("Delayd-Target", "a.b", "Delayd-Delay", "0s"), "", 0},
		{"past within limit", h("Delayd-Target", "a.b", "Delayd-At", "2026-11-30T09:59:30Z"), "", 0},
		{"past over limit", h("Delayd-Target", "a.b", "Delayd-At", "2026-11-30T09:58:00Z"), "", 400},
		{"future over limit", h("Delayd-Target", "a.b", "Delayd-At", "2026-11-30T12:00:00Z"), "", 400},
		{"delay over limit", h("Delayd-Target", "a.b", "Delayd-Delay", "2h"), "", 400},
		{"duplicate control", h("Delayd-Target", "a.b", "Delayd-Target", "c", "Delayd-Delay", "1s"), "", 400},
		{"payload limit", h("Delayd-Target", "a.b", "Delayd-Delay", "1s"), strings.Repeat("x", 101), 413},
		{"header count limit", h("Delayd-Target", "a.b", "Delayd-Delay", "1s", "A", "1", "B", "2", "C", "3"), "", 413},
		{"header bytes limit", h("Delayd-Target", "a.b", "Delayd-Delay", "1s", "A", strings.Repeat("v", 200)), "", 413},
		{"id limit", h("Delayd-Target", "a.b", "Delayd-Delay", "1s", "Delayd-Id", strings.Repeat("i", 17)), "", 400},
		{"invalid utf8 id", h("Delayd-Target", "a.b", "Delayd-Delay", "1s", "Delayd-Id", "\xff"), "", 400},
		{"empty id", h("Delayd-Target", "a.b", "Delayd-Delay", "1s", "Delayd-Id", ""), "", 400},
		{"denied $KV", h("Delayd-Target", "$KV.b.c", "Delayd-Delay", "1s"), "", 403},
		{"own subject", h("Delayd-Target", "delayd.cancel", "Delayd-Delay", "1s"), "", 403},
		{"space in target", h("Delayd-Target", "a b", "Delayd-Delay", "1s"), "", 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSchedule(tc.h, []byte(tc.payload), lim, pol, now)
			if tc.code == 0 {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || CodeOf(err) != tc.code {
				t.Fatalf("got %v (code %d), want code %d", err, CodeOf(err), tc.code)
			}
		})
	}
}

func TestParseKeepsPassThroughHeaders(t *testing.T) {
	r, err := ParseSchedule(map[string][]string{
		"Delayd-Target": {"a"}, "Delayd-Delay": {"1s"}, "traceparent": {"t"}, "X": {"1", "2"},
	}, nil, Limits{MaxPayload: 1, MaxIDLen: 1, MaxHeaders: 8, MaxHeaderBytes: 100, MaxDelay: time.Hour}, pol, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r.Header, map[string][]string{"traceparent": {"t"}, "X": {"1", "2"}}) {
		t.Fatalf("pass-through headers: %v", r.Header)
	}
}

func TestCodecRoundTrip(t *testing.T) {
	e := Envelope{Target: "orders.cancel", Header: map[string][]string{"a": {"1", ""}, "b": {}}, Payload: []byte{0, 1, 2, 255}}
	b := Encode(e)
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Target != e.Target || !bytes.Equal(got.Payload, e.Payload) || !reflect.DeepEqual(got.Header, e.Header) {
		t.Fatalf("round trip: %+v", got)
	}
	if len(Version(b)) != VersionSize || bytes.Equal(Version(b), Version(Encode(e))) {
		t.Fatal("each encoding must get a fresh version")
	}
	for _, bad := range [][]byte{nil, {2, 0, 0, 0, 0, 0, 0, 0, 0}, b[:10]} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("decoded corrupt %v", bad)
		}
	}
}

// The encoding must stay compact: it is most of Redis memory per envelope.
func TestEncodingOverhead(t *testing.T) {
	e := Envelope{Target: "orders.cancel", Payload: make([]byte, 128)}
	if over := len(Encode(e)) - len(e.Payload) - len(e.Target); over > 12 {
		t.Fatalf("overhead %d bytes", over)
	}
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		p, s string
		want bool
	}{
		{"a.b", "a.b", true}, {"a.*", "a.b", true}, {"a.*", "a.b.c", false}, {"a.>", "a.b.c", true},
		{"a.>", "a", false}, {">", "a", true}, {"*", "a.b", false}, {"$SYS.>", "$SYS.REQ", true},
		{"a.b", "a", false}, {"a", "a.b", false},
	} {
		if got := Match(tc.p, tc.s); got != tc.want {
			t.Errorf("Match(%q, %q) = %v", tc.p, tc.s, got)
		}
	}
}

func TestValidTarget(t *testing.T) {
	for s, want := range map[string]bool{
		"a": true, "a.b-c_d": true, "": false, "a.": false, ".a": false, "a..b": false,
		"a.*": false, ">": false, "a b": false, "a\tb": false,
	} {
		if ValidTarget(s) != want {
			t.Errorf("ValidTarget(%q) != %v", s, want)
		}
	}
}

// Due times must fit Redis exactly whatever the limits: with no limit on
// the past and a 100-year max delay, times outside 1970..2200 are 400,
// never held for centuries or delivered at once after an overflow.
func TestTimeBoundsWithLimitsRaised(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	wide := lim
	wide.MaxPast, wide.MaxDelay = 0, MaxDelayLimit
	for _, at := range []string{"1000-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "2300-01-01T00:00:00Z", "9999-12-31T23:59:59Z"} {
		_, err := ParseSchedule(map[string][]string{"Delayd-Target": {"a.b"}, "Delayd-At": {at}}, nil, wide, pol, now)
		if CodeOf(err) != CodeBadRequest || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("Delayd-At %s: want 400 out of range, got %v", at, err)
		}
	}
	for _, d := range []string{"2562047h47m16.854775807s", "876001h"} {
		_, err := ParseSchedule(map[string][]string{"Delayd-Target": {"a.b"}, "Delayd-Delay": {d}}, nil, wide, pol, now)
		if CodeOf(err) != CodeBadRequest {
			t.Errorf("Delayd-Delay %s: want 400, got %v", d, err)
		}
	}
	r, err := ParseSchedule(map[string][]string{"Delayd-Target": {"a.b"}, "Delayd-At": {"1970-01-01T00:00:00Z"}}, nil, wide, pol, now)
	if err != nil || !r.HasAt {
		t.Fatalf("the epoch itself is in range: %v", err)
	}
}
