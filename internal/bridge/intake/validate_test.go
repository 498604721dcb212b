package intake

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
)

// The store keeps due times in µs: a Delayd-At or Delayd-Delay with
// nanoseconds left over is rounded up to the next µs, never down, so the
// envelope is never due before its time.
func TestDueRoundedUpToTheMicrosecond(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	v := testValidator(t, now, envelope.Limits{MaxIDLen: 256, MaxHeaders: 64, MaxHeaderBytes: 16 << 10, MaxDelay: time.Hour})
	newID := func() (string, error) { return "x", nil }
	for _, tc := range []struct {
		header, value string
		wantAt        bool
		want          int64 // µs: AtMicros or DelayMicros
	}{
		{envelope.HeaderAt, now.Add(time.Second + time.Nanosecond).Format(time.RFC3339Nano), true, now.UnixMicro() + 1_000_001},
		{envelope.HeaderAt, now.Add(time.Second + 999*time.Nanosecond).Format(time.RFC3339Nano), true, now.UnixMicro() + 1_000_001},
		{envelope.HeaderAt, now.Add(time.Second + time.Microsecond).Format(time.RFC3339Nano), true, now.UnixMicro() + 1_000_001},
		{envelope.HeaderDelay, "1.000001s", false, 1_000_001},
		{envelope.HeaderDelay, "1.0000001s", false, 1_000_001},
	} {
		h := map[string][]string{envelope.HeaderTarget: {"orders.x"}, tc.header: {tc.value}}
		it, err := v.item(h, []byte("p"), newID)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.header, tc.value, err)
		}
		got := it.DelayMicros
		if tc.wantAt {
			got = it.AtMicros
		}
		if it.Absolute != tc.wantAt || got != tc.want {
			t.Errorf("%s %s: absolute %v, %d µs; want %v, %d µs", tc.header, tc.value, it.Absolute, got, tc.wantAt, tc.want)
		}
	}
}

// A jitter moves the stored due time (a Delayd-At's, a Delayd-Delay's, a
// series' first) by the id's offset for occurrence 1, whether the id is
// the publisher's or generated; the envelope keeps the jitter for the
// occurrences after.
func TestJitterMovesTheDueTime(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	v := testValidator(t, now, envelope.Limits{MaxIDLen: 256, MaxHeaders: 64, MaxHeaderBytes: 16 << 10, MaxDelay: time.Hour,
		MaxJitter: time.Minute})
	newID := func() (string, error) { return "generated", nil }
	const d = 30 * time.Second
	for _, tc := range []struct {
		header, value, id string
		wantAt            bool
		base              int64 // µs: AtMicros or DelayMicros without jitter
	}{
		{envelope.HeaderAt, now.Add(time.Minute).Format(time.RFC3339Nano), "a", true, now.Add(time.Minute).UnixMicro()},
		{envelope.HeaderDelay, "10s", "b", false, 10_000_000},
		{envelope.HeaderDelay, "10s", "", false, 10_000_000},
		{envelope.HeaderEvery, "1m", "c", false, 60_000_000},
		{envelope.HeaderStart, now.Add(5 * time.Second).Format(time.RFC3339Nano), "d", true, now.Add(5 * time.Second).UnixMicro()},
	} {
		h := map[string][]string{envelope.HeaderTarget: {"orders.x"}, tc.header: {tc.value}, envelope.HeaderJitter: {d.String()}}
		if tc.header == envelope.HeaderStart {
			h[envelope.HeaderEvery] = []string{"1m"}
		}
		id := tc.id
		if id != "" {
			h[envelope.HeaderID] = []string{id}
		} else {
			id = "generated"
		}
		it, err := v.item(h, []byte("p"), newID)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.header, tc.value, err)
		}
		got := it.DelayMicros
		if tc.wantAt {
			got = it.AtMicros
		}
		want := tc.base + envelope.JitterOffset(id, 1, d).Microseconds()
		if it.Absolute != tc.wantAt || got != want || it.ID != id {
			t.Errorf("%s %s: absolute %v, %d µs, id %q; want %v, %d µs, %q", tc.header, tc.value, it.Absolute, got, it.ID, tc.wantAt, want, id)
		}
		if e, err := envelope.Decode(it.Data); err != nil || e.Jitter != d {
			t.Errorf("%s %s: stored jitter %v (%v), want %v", tc.header, tc.value, e.Jitter, err, d)
		}
	}
}

// testValidator is a validator at the fixed time now, on a NATS server of
// the test's own (it sizes deliveries against the server's max_payload).
func testValidator(t *testing.T, now time.Time, limits envelope.Limits) validator {
	t.Helper()
	n := testutil.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return validator{nc: nc, policy: envelope.Policy{Prefix: "delayd"}, now: func() time.Time { return now }, limits: limits}
}
