package intake

import (
	"encoding/json"
	"time"

	"github.com/delayd/delayd/client"
)

// appendScheduled appends the JSON of a schedule's reply,
// client.Scheduled{ID: id, DeliverAt: due ms}, exactly as encoding/json
// writes it. By hand because it runs for every stored envelope, where
// json.Marshal's reflection and allocations showed in the intake's
// profile. An id with a character JSON escapes goes through json.Marshal.
func appendScheduled(b []byte, id string, dueMs int64) []byte {
	at := time.UnixMilli(dueMs).UTC()
	if !plainJSON(id) {
		out, err := json.Marshal(client.Scheduled{ID: id, DeliverAt: at})
		if err != nil { // a time.Time outside years 0-9999 only
			return append(b, `{}`...)
		}
		return append(b, out...)
	}
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	b = append(b, `","deliver_at":"`...)
	b = at.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}

// plainJSON reports whether encoding/json writes s as it is: printable
// ASCII without the quote, the backslash and the HTML characters it
// escapes by default.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20, c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}
