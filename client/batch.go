package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
)

// headerBatch marks a batch request; batchJSON is its one format.
const (
	headerBatch = "Delayd-Batch"
	batchJSON   = "json"
)

// Envelope is one schedule of a batch: the arguments of a Schedule call.
type Envelope struct {
	Target  string
	Payload []byte
	Options []ScheduleOption
}

// BatchResult is one envelope's outcome in a batch.
type BatchResult struct {
	// Scheduled is set when the envelope is stored (Err nil).
	Scheduled
	// Err is why it is not: an error found in its options before sending
	// (ErrBadRequest, nothing sent), or the daemon's *ServiceError for it
	// (400, 403, 413; 503 nothing stored; 504 the outcome is unknown, with
	// the ID to resend with), matching the sentinels like Schedule's.
	Err error
}

// ScheduleBatch stores many envelopes with one request (docs/protocol.md,
// "Batches"): one result per envelope, in order. Each envelope stands
// alone: a bad one is refused, the rest are stored.
//
// The error is for the batch as a whole, and then no result is returned:
// ErrUnavailable (nothing stored: no delayd answers, or it is stopping),
// ErrTooLarge (over the daemon's intake.max_batch envelopes, default 1000,
// or over the NATS server's max_payload: nothing sent; or its reply could
// outgrow max_payload: nothing stored, send fewer), ErrBadRequest, or
// ErrOutcomeUnknown when ctx ends before the reply. Then any envelope may
// or may not be stored: resend the batch. That is safe only for envelopes
// with an ID option (a resend replaces, or after the delivery is answered
// from the daemon's memory of it); envelopes without one get a new id on
// every send.
func (c *Client) ScheduleBatch(ctx context.Context, envelopes []Envelope) ([]BatchResult, error) {
	results := make([]BatchResult, len(envelopes))
	entries := make([][]byte, 0, len(envelopes))
	idx := make([]int, 0, len(envelopes))
	for i, e := range envelopes {
		m, err := build(e.Target, e.Payload, e.Options)
		if err != nil {
			results[i].Err = err
			continue
		}
		entries = append(entries, appendEntry(nil, m))
		idx = append(idx, i)
	}
	if len(entries) == 0 {
		return results, nil
	}
	got, err := c.sendBatch(ctx, entries, "")
	if err != nil {
		return nil, err
	}
	for j, i := range idx {
		results[i] = got[j]
	}
	return results, nil
}

// sendBatch sends the encoded entries as one batch request and returns
// their results; id names the envelope in the error of an unknown outcome
// (one caller's, in the batching mode; "" for ScheduleBatch).
func (c *Client) sendBatch(ctx context.Context, entries [][]byte, id string) ([]BatchResult, error) {
	m := &nats.Msg{Header: nats.Header{headerBatch: []string{batchJSON}}, Data: joinEntries(entries)}
	resp, err := c.roundTrip(ctx, "schedule batch", "schedule", id, m)
	if err != nil {
		return nil, err
	}
	var body struct {
		Results []struct {
			ID        string    `json:"id"`
			DeliverAt time.Time `json:"deliver_at"`
			Code      int       `json:"code"`
			Error     string    `json:"error"`
		} `json:"results"`
	}
	if err := json.Unmarshal(resp.Data, &body); err != nil || len(body.Results) != len(entries) {
		if err == nil {
			err = fmt.Errorf("%d results for %d envelopes", len(body.Results), len(entries))
		}
		return nil, fmt.Errorf("delayd schedule batch: bad reply %.200q: %w", resp.Data, err)
	}
	out := make([]BatchResult, len(entries))
	for i, r := range body.Results {
		if r.Code != 0 {
			out[i].Err = &ServiceError{Code: r.Code, Message: r.Error, ID: r.ID}
			continue
		}
		out[i].Scheduled = Scheduled{ID: r.ID, DeliverAt: r.DeliverAt}
	}
	return out, nil
}

// joinEntries is the batch body: the entries as a JSON array.
func joinEntries(entries [][]byte) []byte {
	n := 2
	for _, e := range entries {
		n += len(e) + 1
	}
	b := append(make([]byte, 0, n), '[')
	for i, e := range entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, e...)
	}
	return append(b, ']')
}

// appendEntry appends the JSON of one envelope of a batch:
// {"headers":{...},"payload":"<base64>"}. By hand, as the daemon reads it:
// the batching mode encodes every Schedule call.
func appendEntry(b []byte, m *nats.Msg) []byte {
	b = append(b, `{"headers":{`...)
	keys := make([]string, 0, len(m.Header))
	for k := range m.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the same request, the same bytes
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		vs := m.Header[k]
		if len(vs) == 1 {
			b = appendJSONString(b, vs[0])
			continue
		}
		b = append(b, '[')
		for j, v := range vs {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, v)
		}
		b = append(b, ']')
	}
	b = append(b, `},"payload":"`...)
	n := len(b)
	b = append(b, make([]byte, base64.StdEncoding.EncodedLen(len(m.Data)))...)
	base64.StdEncoding.Encode(b[n:], m.Data)
	return append(b, `"}`...)
}

// appendJSONString appends s as a JSON string: quote, backslash and the
// control characters escaped, everything else as it is.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// errClosed is the answer to a batched Schedule pending when Close was
// called.
var errClosed = errors.New("client closed")
