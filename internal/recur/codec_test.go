package recur

import (
	"bytes"
	"testing"
	"time"
)

func TestCodecRoundTrip(t *testing.T) {
	start := time.Date(2026, 11, 30, 10, 0, 0, 123456789, time.UTC)
	for _, r := range []Rule{
		{Every: time.Second},
		{Every: 90 * time.Minute, Start: start, Until: start.Add(time.Hour), Count: 5, CatchUp: All},
		{Cron: "@daily"},
		{Cron: "0 30 2 * * *", Zone: "Australia/Sydney", Start: time.Unix(0, 0).UTC(), Count: 1},
	} {
		b := r.Encode()
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		if got != r || !bytes.Equal(got.Encode(), b) {
			t.Fatalf("round trip changed %+v into %+v", r, got)
		}
	}
	if n := len(Rule{Every: time.Minute}.Encode()); n != 5 {
		t.Errorf("every 1m takes %d bytes, want 5", n)
	}
	for _, bad := range [][]byte{nil, {1}, {2, 0, 0xe8, 7}, {1, 0x40, 0xe8, 7}, {1, 0, 0xe8, 7, 0}, {1, hasCount, 0xe8, 7, 0}, {1, kindCron, 3, 'a', 'b'}} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("decoded corrupt %v", bad)
		}
	}
}

// FuzzDecode: arbitrary bytes decode to a valid rule or an error, never a
// panic; a decoded rule encodes back to a rule equal to it, and its first
// occurrences can be computed.
func FuzzDecode(f *testing.F) {
	start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for _, r := range []Rule{
		{Every: time.Minute},
		{Every: time.Hour, Start: start, Until: start.AddDate(1, 0, 0), Count: 3, CatchUp: All},
		{Cron: "0 */5 * * * *", Zone: "Europe/Berlin"},
		{Cron: "@hourly", Until: start},
	} {
		f.Add(r.Encode())
	}
	f.Add([]byte{1, kindCron, 5, 'T', 'Z', '=', 'x', 'y'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("decoded an invalid rule %+v: %v", r, err)
		}
		again, err := Decode(r.Encode())
		if err != nil || again != r {
			t.Fatalf("re-encoding changed %+v into %+v (%v)", r, again, err)
		}
		if due, ok := r.First(start); ok {
			if next, ok := r.Next(due, due, 1); ok && !next.After(due) {
				t.Fatalf("%s: next %v is not after %v", r, next, due)
			}
		}
	})
}
