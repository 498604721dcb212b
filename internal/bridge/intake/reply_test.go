package intake

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/delayd/delayd/client"
)

// The hand-written reply must be byte for byte what encoding/json writes,
// for every id the intake accepts and any due time.
func TestAppendScheduledMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	ids := []string{"a", "order-42", "x y", `q"uote`, `back\slash`, "<tag>&", "ünïcode", "日本",
		"\u2028sep", "tab\tin", "~!@#$%^*()_+{}|:?", "\x7f"}
	dues := []int64{1, 999, 1000, 1_700_000_000_123, 1_700_000_000_100, 1_700_000_000_000, 253402300799999}
	for _, id := range ids {
		for _, due := range dues {
			want, err := json.Marshal(client.Scheduled{ID: id, DeliverAt: time.UnixMilli(due).UTC()})
			if err != nil {
				t.Fatal(err)
			}
			if got := appendScheduled(nil, id, due); string(got) != string(want) {
				t.Errorf("id %q due %d: got %s, want %s", id, due, got, want)
			}
		}
	}
}

func FuzzAppendScheduled(f *testing.F) {
	f.Add("order-1", int64(1_700_000_000_123))
	f.Fuzz(func(t *testing.T, id string, due int64) {
		if due < 0 || due > 253402300799999 {
			return
		}
		want, err := json.Marshal(client.Scheduled{ID: id, DeliverAt: time.UnixMilli(due).UTC()})
		if err != nil {
			return
		}
		if got := appendScheduled(nil, id, due); string(got) != string(want) {
			t.Errorf("id %q due %d: got %s, want %s", id, due, got, want)
		}
	})
}
