package envelope

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/recur"
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
	rule := recur.Rule{Cron: "0 30 2 * * *", Zone: "Europe/Berlin", Count: 3}
	for _, e := range []Envelope{
		{Target: "orders.cancel", Header: map[string][]string{"a": {"1", ""}, "b": {}}, Payload: []byte{0, 1, 2, 255}},
		{Target: "reports.daily", Series: &rule, Payload: []byte("run")},
	} {
		b := Encode(e)
		if b[0] != formatV2 {
			t.Fatalf("format %d", b[0])
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, e) {
			t.Fatalf("round trip: %+v", got)
		}
		if !bytes.Equal(b, Encode(e)) {
			t.Fatal("encoding is not deterministic")
		}
		for _, bad := range [][]byte{nil, {3}, {1, 0, 0, 0, 0, 0, 0, 0, 0}, b[:len(b)-len(e.Payload)-1]} {
			if _, err := Decode(bad); err == nil {
				t.Errorf("decoded corrupt %v", bad)
			}
		}
	}
	// A corrupt series is a corrupt envelope, not a one-shot.
	b := Encode(Envelope{Target: "a", Series: &rule})
	b[len(b)-1] = 0xff
	if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt series: %v", err)
	}
}

// Values stored before format 2 must still decode: format 1 had 8 version
// bytes after the format byte and no series.
func TestDecodeFormat1(t *testing.T) {
	v1 := []byte{1, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, // format, version
		13, 'o', 'r', 'd', 'e', 'r', 's', '.', 'c', 'a', 'n', 'c', 'e', 'l',
		1, 2, 't', 'p', 1, 1, 'v', // one header tp: [v]
		'h', 'i'}
	got, err := Decode(v1)
	if err != nil {
		t.Fatal(err)
	}
	want := Envelope{Target: "orders.cancel", Header: map[string][]string{"tp": {"v"}}, Payload: []byte("hi")}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v", got)
	}
}

// The encoding must stay compact: it is most of Redis memory per envelope.
// Format 2 costs 4 bytes on a one-shot without headers (format 1: 11).
func TestEncodingOverhead(t *testing.T) {
	e := Envelope{Target: "orders.cancel", Payload: make([]byte, 128)}
	if over := len(Encode(e)) - len(e.Payload) - len(e.Target); over != 4 {
		t.Fatalf("overhead %d bytes", over)
	}
	e.Series = &recur.Rule{Every: time.Minute}
	if over := len(Encode(e)) - len(e.Payload) - len(e.Target); over > 10 {
		t.Fatalf("overhead with every 1m: %d bytes", over)
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
