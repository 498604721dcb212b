package envelope

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// Delayd-Jitter takes a positive duration up to limits.max_jitter, on a
// one-shot and on a series; anything else is refused with the header named.
func TestParseJitter(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	lim := lim
	lim.MaxJitter = time.Minute
	for _, tc := range []struct {
		name, when, whenVal, jitter string
		want                        time.Duration
		err                         string // "": accepted
	}{
		{"delay", HeaderDelay, "30s", "2s", 2 * time.Second, ""},
		{"at", HeaderAt, "2026-11-30T10:05:00Z", "1500ms", 1500 * time.Millisecond, ""},
		{"series", HeaderEvery, "1m", "10s", 10 * time.Second, ""},
		{"at the limit", HeaderDelay, "1s", "1m", time.Minute, ""},
		{"zero", HeaderDelay, "1s", "0s", 0, "must be positive"},
		{"negative", HeaderDelay, "1s", "-2s", 0, "must be positive"},
		{"over the limit", HeaderDelay, "1s", "61s", 0, "over the limit of 1m0s"},
		{"garbage", HeaderDelay, "1s", "soon", 0, "not a duration"},
		{"no unit", HeaderDelay, "1s", "2", 0, "not a duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseSchedule(map[string][]string{HeaderTarget: {"a.b"}, tc.when: {tc.whenVal}, "delayd-jitter": {tc.jitter}},
				nil, lim, pol, now)
			if tc.err == "" {
				if err != nil || r.Jitter != tc.want {
					t.Fatalf("jitter %q: %v, %v; want %v", tc.jitter, r.Jitter, err, tc.want)
				}
				if _, ok := r.Header["delayd-jitter"]; ok {
					t.Fatal("Delayd-Jitter travels as a header")
				}
				return
			}
			if err == nil || CodeOf(err) != CodeBadRequest || !strings.Contains(err.Error(), HeaderJitter) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("jitter %q: %v, want a 400 naming %s and saying %q", tc.jitter, err, HeaderJitter, tc.err)
			}
		})
	}
}

// A request with a jitter is another request than one without, or with
// another jitter; the same one resent has the same fingerprint.
func TestJitterInFingerprint(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	lim := lim
	lim.MaxJitter = time.Minute
	fp := func(jitter string) string {
		t.Helper()
		h := map[string][]string{HeaderTarget: {"a.b"}, HeaderDelay: {"30s"}}
		if jitter != "" {
			h[HeaderJitter] = []string{jitter}
		}
		r, err := ParseSchedule(h, nil, lim, pol, now)
		if err != nil {
			t.Fatal(err)
		}
		return r.Fingerprint()
	}
	if a, b := fp("2s"), fp("2s"); a != b || a == fp("") || a == fp("3s") {
		t.Fatal("the fingerprint does not tell jitters apart, or is not stable")
	}
}

// The jitter travels in the stored value and out of the headers a target
// sees; an envelope without one is stored as before.
func TestJitterRoundTrip(t *testing.T) {
	e := Envelope{Target: "t.x", Header: map[string][]string{"K": {"v"}}, Payload: []byte("p"), Jitter: 2500 * time.Millisecond}
	got, err := Decode(Encode(e))
	if err != nil {
		t.Fatal(err)
	}
	if got.Jitter != e.Jitter || len(got.Header) != 1 || got.Header["K"][0] != "v" {
		t.Fatalf("round trip: jitter %v, headers %v", got.Jitter, got.Header)
	}
	e.Header = nil
	if got, err := Decode(Encode(e)); err != nil || got.Header != nil || got.Jitter != e.Jitter {
		t.Fatalf("jitter only: %v, headers %v, err %v", got.Jitter, got.Header, err)
	}
	plain := Envelope{Target: "t.x", Header: map[string][]string{"K": {"v"}}, Payload: []byte("p")}
	if string(Encode(plain)) != string(Encode(Envelope{Target: "t.x", Header: map[string][]string{"K": {"v"}}, Payload: []byte("p")})) ||
		strings.Contains(string(Encode(plain)), headerJitter) {
		t.Fatal("an envelope without jitter is not stored as before")
	}
	// Only delayd writes it: a publisher cannot set a jitter past the limit.
	if _, err := ParseSchedule(map[string][]string{HeaderTarget: {"a.b"}, HeaderDelay: {"1s"}, headerJitter: {"5"}},
		nil, lim, pol, time.Now()); err == nil {
		t.Errorf("a publisher's %s header was accepted", headerJitter)
	}
	for _, v := range []string{"0", "-5", "01", "x"} {
		bad := Encode(Envelope{Target: "t", Header: map[string][]string{headerJitter: {v}}})
		if _, err := Decode(bad); err == nil {
			t.Errorf("%s %q decoded, want ErrCorrupt", headerJitter, v)
		}
	}
}

// The offsets of 1,000 ids under a 2 s jitter lie in [0, 2 s), in whole
// ms, spread over most of it, and are the same every time they are drawn.
func TestJitterOffset(t *testing.T) {
	const d = 2 * time.Second
	lo, hi := d, time.Duration(-1)
	for i := range 1000 {
		id := "order-" + strconv.Itoa(i)
		off := JitterOffset(id, 1, d)
		if off < 0 || off >= d || off%time.Millisecond != 0 {
			t.Fatalf("%s: offset %v, want whole ms in [0, %v)", id, off, d)
		}
		if JitterOffset(id, 1, d) != off {
			t.Fatalf("%s: offset not deterministic", id)
		}
		lo, hi = min(lo, off), max(hi, off)
	}
	if hi-lo < 1500*time.Millisecond {
		t.Fatalf("offsets spread over %v, want at least 1.5s", hi-lo)
	}
	same := 0
	for k := int64(1); k <= 100; k++ {
		if JitterOffset("s", k, d) == JitterOffset("s", k+1, d) {
			same++
		}
	}
	if same > 5 {
		t.Fatalf("%d of 100 occurrences drew their predecessor's offset", same)
	}
	if JitterOffset("x", 1, 0) != 0 {
		t.Fatal("no jitter, yet an offset")
	}
}

// Even the largest offset must keep the due time before MaxDue.
func TestJitterKeepsTheDueInRange(t *testing.T) {
	now := MaxDue.Add(-time.Hour)
	lim := lim
	lim.MaxJitter = 2 * time.Hour
	for _, tc := range []struct {
		when, value, jitter string
		ok                  bool
	}{
		{HeaderAt, MaxDue.Add(-30 * time.Minute).Format(time.RFC3339), "10m", true},
		{HeaderAt, MaxDue.Add(-30 * time.Minute).Format(time.RFC3339), "30m", false},
		{HeaderDelay, "30m", "1h", false},
	} {
		_, err := ParseSchedule(map[string][]string{HeaderTarget: {"a.b"}, tc.when: {tc.value}, HeaderJitter: {tc.jitter}}, nil, lim, pol, now)
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "out of range")) {
			t.Errorf("%s %s, jitter %s: %v, want ok %v", tc.when, tc.value, tc.jitter, err, tc.ok)
		}
	}
}
