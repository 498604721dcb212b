package envelope

import (
	"testing"
	"time"
)

// TestFingerprint: one request sent twice has one fingerprint, whenever it
// is sent (a Delayd-Delay resent later, a past Delayd-At accepted later);
// anything the publisher asks differently changes it. The id is not part
// of it (the tombstone is looked up by id). It survives the stored value.
func TestFingerprint(t *testing.T) {
	lim := Limits{MaxPayload: 1 << 20, MaxIDLen: 256, MaxHeaders: 64, MaxHeaderBytes: 16 << 10,
		MaxDelay: 24 * time.Hour, MaxPast: 24 * time.Hour}
	now := time.Now()
	at := now.Add(-time.Hour).UTC().Format(time.RFC3339Nano)
	fp := func(payload string, when time.Time, kv ...string) string {
		t.Helper()
		h := map[string][]string{}
		for i := 0; i < len(kv); i += 2 {
			h[kv[i]] = append(h[kv[i]], kv[i+1])
		}
		r, err := ParseSchedule(h, []byte(payload), lim, Policy{}, when)
		if err != nil {
			t.Fatal(err)
		}
		return r.Fingerprint()
	}
	base := fp("p", now, "Delayd-Target", "a.b", "Delayd-Delay", "30m", "Delayd-Id", "x", "X-A", "1", "X-B", "2")
	if len(base) != fingerprintLen {
		t.Fatalf("fingerprint of %d bytes", len(base))
	}
	same := map[string]string{
		"later":    fp("p", now.Add(time.Minute), "Delayd-Target", "a.b", "Delayd-Delay", "30m", "Delayd-Id", "x", "X-B", "2", "X-A", "1"),
		"other id": fp("p", now, "Delayd-Target", "a.b", "Delayd-Delay", "1800s", "Delayd-Id", "y", "X-A", "1", "X-B", "2"),
	}
	for name, got := range same {
		if got != base {
			t.Errorf("%s: fingerprint differs", name)
		}
	}
	differ := map[string]string{
		"payload":   fp("q", now, "Delayd-Target", "a.b", "Delayd-Delay", "30m", "Delayd-Id", "x", "X-A", "1", "X-B", "2"),
		"target":    fp("p", now, "Delayd-Target", "a.c", "Delayd-Delay", "30m", "Delayd-Id", "x", "X-A", "1", "X-B", "2"),
		"delay":     fp("p", now, "Delayd-Target", "a.b", "Delayd-Delay", "31m", "Delayd-Id", "x", "X-A", "1", "X-B", "2"),
		"header":    fp("p", now, "Delayd-Target", "a.b", "Delayd-Delay", "30m", "Delayd-Id", "x", "X-A", "1", "X-B", "3"),
		"no header": fp("p", now, "Delayd-Target", "a.b", "Delayd-Delay", "30m", "Delayd-Id", "x", "X-A", "1"),
		"at":        fp("p", now, "Delayd-Target", "a.b", "Delayd-At", at, "Delayd-Id", "x", "X-A", "1", "X-B", "2"),
	}
	for name, got := range differ {
		if got == base {
			t.Errorf("%s: same fingerprint", name)
		}
	}
	past := fp("p", now, "Delayd-Target", "a.b", "Delayd-At", at)
	if fp("p", now.Add(time.Minute), "Delayd-Target", "a.b", "Delayd-At", at) != past {
		t.Error("a past Delayd-At accepted later: fingerprint differs")
	}

	e := Envelope{Target: "a.b", Payload: []byte("p"), Request: base, Stored: now.Truncate(time.Millisecond)}
	d, err := Decode(Encode(e))
	if err != nil || d.Request != base || d.Header != nil {
		t.Fatalf("decoded %+v, %v: want the fingerprint back and no header", d, err)
	}
	if _, err := ParseSchedule(map[string][]string{"Delayd-Target": {"a.b"}, "Delayd-Delay": {"1s"},
		"Delayd-Request": {"00"}}, nil, lim, Policy{}, now); err == nil {
		t.Error("a publisher's Delayd-Request header was accepted")
	}
}
