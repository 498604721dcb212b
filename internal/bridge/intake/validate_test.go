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
	n := testutil.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	now := time.Unix(1_800_000_000, 0)
	v := validator{nc: nc, policy: envelope.Policy{Prefix: "delayd"}, now: func() time.Time { return now },
		limits: envelope.Limits{MaxIDLen: 256, MaxHeaders: 64, MaxHeaderBytes: 16 << 10, MaxDelay: time.Hour}}
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
