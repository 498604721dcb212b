package envelope

import (
	"encoding/base64"
	"strings"
)

// A batch is many schedule requests in one NATS message: the header
// Delayd-Batch names its format, and the body holds the envelopes. The
// format is JSON, because every language's standard library reads and
// writes it (and base64, for the payloads), the shell included with jq and
// base64, and because the replies are JSON already:
//
//	[{"headers": {"Delayd-Target": "orders.cancel", "Delayd-Delay": "30m"},
//	  "payload": "aGVsbG8="}, ...]
//
// A header value is a string or an array of strings (a header given more
// than once). docs/protocol.md has the whole contract.
const (
	HeaderBatch = "Delayd-Batch"
	// BatchJSON is the one batch format, the value of Delayd-Batch.
	BatchJSON = "json"
	// MaxBatchDepth bounds how deep a batch body nests. An envelope needs
	// four levels (the array, the envelope, its headers, a header's values);
	// the rest is room for an unknown field, which is refused anyway. The
	// reader refuses a deeper body before it descends, so a body of nothing
	// but brackets costs neither stack nor memory.
	MaxBatchDepth = 8
)

// BatchEntry is one envelope of a batch, as the publisher sent it: its
// headers and payload are checked like a single request's (ParseSchedule).
type BatchEntry struct {
	Header map[string][]string
	// Payload is the decoded payload.
	Payload []byte
	// Err, when set, refuses this envelope alone (400): it was not an
	// object of headers and payload.
	Err error
}

// IsBatch reports whether a message's headers mark it a batch, and with
// which format (the value of Delayd-Batch, trimmed).
func IsBatch(h map[string][]string) (string, bool) {
	if vs, ok := h[HeaderBatch]; ok && len(vs) > 0 {
		return strings.TrimSpace(vs[0]), true
	}
	for k, vs := range h {
		if len(k) == len(HeaderBatch) && strings.EqualFold(k, HeaderBatch) {
			if len(vs) == 0 {
				return "", true
			}
			return strings.TrimSpace(vs[0]), true
		}
	}
	return "", false
}

// ParseBatch checks what a batch message carries besides its envelopes and
// decodes them. A batch is refused as a whole (an *Error: nothing of it is
// stored) when its headers hold anything but Delayd-Batch (the caller
// drops the headers nats-server stamps first), its format is unknown, its
// body is not a JSON array, or it holds more than maxEnvelopes envelopes
// (413). An envelope that is not an object of headers and payload is
// refused alone (BatchEntry.Err); every other check is ParseSchedule's,
// per envelope.
//
// The body is read by hand, not with encoding/json: for this one shape it
// is several times faster (BenchmarkParseBatch), and the intake parses
// every envelope of every batch.
func ParseBatch(h map[string][]string, body []byte, maxEnvelopes int) ([]BatchEntry, error) {
	for k, vs := range h {
		if !strings.EqualFold(k, HeaderBatch) {
			return nil, reject(CodeBadRequest, "a batch carries its headers in each envelope: header %s is not allowed on the batch message", Quote(k))
		}
		if len(vs) != 1 {
			return nil, reject(CodeBadRequest, "header %s must appear exactly once", HeaderBatch)
		}
		if f := strings.TrimSpace(vs[0]); f != BatchJSON {
			return nil, reject(CodeBadRequest, "%s %s is not a batch format delayd knows (%q)", HeaderBatch, Quote(f), BatchJSON)
		}
	}
	p := batchParser{b: body}
	out, err := p.array(maxEnvelopes)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (p *batchParser) array(maxEnvelopes int) ([]BatchEntry, error) {
	if p.peek() != '[' {
		return nil, p.syntax("not an array")
	}
	p.i++
	var out []BatchEntry
	n := 0
	if p.peek() == ']' {
		p.i++
	} else {
		for {
			if n < maxEnvelopes {
				e, err := p.entry()
				if err != nil {
					return nil, err
				}
				if out == nil {
					out = make([]BatchEntry, 0, min(maxEnvelopes, 1+len(p.b)/64))
				}
				out = append(out, e)
			} else if err := p.skip(1); err != nil {
				// Over the limit: only counted.
				return nil, err
			}
			n++
			switch p.peek() {
			case ',':
				p.i++
				continue
			case ']':
				p.i++
			default:
				return nil, p.syntax("expected , or ]")
			}
			break
		}
	}
	if p.ws(); p.i != len(p.b) {
		return nil, p.syntax("data after the array")
	}
	if n > maxEnvelopes {
		return nil, reject(CodeTooLarge, "the batch holds %d envelopes, over the limit of %d (intake.max_batch): nothing of it was stored", n, maxEnvelopes)
	}
	if out == nil {
		out = []BatchEntry{}
	}
	return out, nil
}

// entry reads an envelope. A value of the wrong shape refuses the
// envelope (BatchEntry.Err); only a syntax error, returned, refuses the
// batch. The error does not name the envelope: its place does (the
// reply's order, or "envelope i of a batch" on the rejected copy).
func (p *batchParser) entry() (BatchEntry, error) {
	var e BatchEntry
	bad := func(format string, args ...any) {
		if e.Err == nil {
			e.Err = reject(CodeBadRequest, format, args...)
		}
	}
	if p.peek() != '{' {
		bad(`not an object of "headers" and "payload"`)
		return e, p.skip(1)
	}
	p.i++
	if p.peek() == '}' {
		p.i++
		return e, nil
	}
	for {
		if p.peek() != '"' {
			return e, p.syntax("expected a key")
		}
		key, err := p.str()
		if err != nil {
			return e, err
		}
		if p.peek() != ':' {
			return e, p.syntax("expected :")
		}
		p.i++
		switch c := p.peek(); {
		case key == "headers" && c == '{':
			if err := p.headers(&e, bad); err != nil {
				return e, err
			}
		case key == "payload" && c == '"':
			s, err := p.bytes()
			if err != nil {
				return e, err
			}
			e.Payload = make([]byte, base64.StdEncoding.DecodedLen(len(s)))
			n, derr := base64.StdEncoding.Decode(e.Payload, s)
			if derr != nil {
				bad("payload is not base64 (standard, padded): %v", derr)
			}
			e.Payload = e.Payload[:n]
		case (key == "headers" || key == "payload") && c == 'n':
			if err := p.skip(2); err != nil { // null: none
				return e, err
			}
		case key == "headers" || key == "payload":
			bad("%q has the wrong type", key)
			if err := p.skip(2); err != nil {
				return e, err
			}
		default:
			bad("unknown field %s (an envelope has \"headers\" and \"payload\")", Quote(key))
			if err := p.skip(2); err != nil {
				return e, err
			}
		}
		switch p.peek() {
		case ',':
			p.i++
			continue
		case '}':
			p.i++
			return e, nil
		}
		return e, p.syntax("expected , or }")
	}
}

// headers reads an object of header names to a string or an array of
// strings. Names and values that a NATS header cannot carry (a line break
// would forge headers of the delivered message) refuse the envelope.
func (p *batchParser) headers(e *BatchEntry, bad func(string, ...any)) error {
	p.i++ // {
	e.Header = map[string][]string{}
	if p.peek() == '}' {
		p.i++
		return nil
	}
	for {
		if p.peek() != '"' {
			return p.syntax("expected a header name")
		}
		kb, err := p.bytes()
		if err != nil {
			return err
		}
		// The protocol's names as constants: no string made for them.
		var k string
		if slot, ok := controlSlots[string(kb)]; ok {
			k = controlNames[slot]
		} else {
			k = string(kb)
		}
		if !validHeaderName(k) {
			bad("header name %s is not a NATS header name", Quote(k))
		}
		if p.peek() != ':' {
			return p.syntax("expected :")
		}
		p.i++
		switch p.peek() {
		case '"':
			v, err := p.str()
			if err != nil {
				return err
			}
			if !validHeaderValue(v) {
				bad("header %s: its value has a control character", k)
			}
			// A name given twice: the last wins, as in every JSON parser.
			e.Header[k] = []string{v}
		case '[':
			p.i++
			delete(e.Header, k)
			if p.peek() == ']' {
				p.i++
				break
			}
			for {
				if p.peek() != '"' {
					bad("header %s: a value must be a string or an array of strings", k)
					if err := p.skip(4); err != nil {
						return err
					}
				} else {
					v, err := p.str()
					if err != nil {
						return err
					}
					if !validHeaderValue(v) {
						bad("header %s: its value has a control character", k)
					}
					e.Header[k] = append(e.Header[k], v)
				}
				c := p.peek()
				p.i++
				if c == ']' {
					break
				}
				if c != ',' {
					p.i--
					return p.syntax("expected , or ]")
				}
			}
		default:
			bad("header %s: a value must be a string or an array of strings", k)
			if err := p.skip(3); err != nil {
				return err
			}
		}
		switch p.peek() {
		case ',':
			p.i++
			continue
		case '}':
			p.i++
			return nil
		}
		return p.syntax("expected , or }")
	}
}

// validHeaderName: printable ASCII without space and colon.
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return true
}

// validHeaderValue: no control character but tab (a line break would
// forge headers of the delivered message). Bytes that are not UTF-8 are
// kept as they are, as the request and stream intakes keep those of a
// NATS header: a value travels to the target byte for byte.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
