package envelope

import (
	"errors"
	"testing"
	"time"
)

// A Delayd-At accepted in the past carries the time it was stored through
// the stored value, out of the headers a target sees; its lateness counts
// from then. One due ahead carries nothing.
func TestStoredTimeOfAPastDueEnvelope(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	lim := Limits{MaxPayload: 1 << 10, MaxIDLen: 64, MaxHeaders: 8, MaxHeaderBytes: 1 << 10, MaxDelay: time.Hour, MaxPast: 24 * time.Hour}
	parse := func(at time.Time) Request {
		t.Helper()
		r, err := ParseSchedule(map[string][]string{HeaderTarget: {"t.x"}, HeaderAt: {at.Format(time.RFC3339Nano)}, "K": {"v"}},
			[]byte("p"), lim, Policy{}, now)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	past := parse(now.Add(-2 * time.Hour))
	if !past.Stored.Equal(now) {
		t.Fatalf("a Delayd-At 2 h past: Stored %v, want %v", past.Stored, now)
	}
	got, err := Decode(Encode(past.Envelope))
	if err != nil {
		t.Fatal(err)
	}
	if !got.Stored.Equal(now) || len(got.Header) != 1 || got.Header["K"][0] != "v" {
		t.Fatalf("round trip: Stored %v, headers %v", got.Stored, got.Header)
	}
	d := Delivery{Due: past.At, Envelope: got}
	if !d.LateSince().Equal(now) {
		t.Fatalf("LateSince %v, want the stored time %v", d.LateSince(), now)
	}
	ahead := parse(now.Add(time.Minute))
	if !ahead.Stored.IsZero() {
		t.Fatalf("a Delayd-At ahead: Stored %v, want zero", ahead.Stored)
	}
	// Within the clocks' skew: its lateness counts from the due time.
	if just := parse(now.Add(-500 * time.Millisecond)); !just.Stored.IsZero() {
		t.Fatalf("a Delayd-At 500 ms past: Stored %v, want zero", just.Stored)
	}
	if d := (Delivery{Due: ahead.At, Envelope: ahead.Envelope}); !d.LateSince().Equal(ahead.At) {
		t.Fatalf("LateSince %v, want the due time", d.LateSince())
	}
	if b, bb := Encode(ahead.Envelope), Encode(Envelope{Target: "t.x", Header: map[string][]string{"K": {"v"}}, Payload: []byte("p")}); string(b) != string(bb) {
		t.Fatal("an envelope due ahead is not stored as before")
	}
	// Only delayd writes it; anything else under that key is corruption.
	bad := Encode(Envelope{Target: "t", Header: map[string][]string{headerStored: {"01"}}})
	if _, err := Decode(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("non-canonical %s: %v, want ErrCorrupt", headerStored, err)
	}
}
