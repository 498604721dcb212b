package envelope

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
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

// batchParser reads a JSON batch body.
type batchParser struct {
	b []byte
	i int
}

func (p *batchParser) syntax(msg string) error {
	return reject(CodeBadRequest, "a %s batch body must be a JSON array of envelopes: %s at byte %d", BatchJSON, msg, p.i)
}

func (p *batchParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// peek is the next byte after white space, 0 at the end.
func (p *batchParser) peek() byte {
	p.ws()
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
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

// str reads a JSON string at p.i (a quote).
func (p *batchParser) str() (string, error) {
	b, err := p.bytes()
	return string(b), err
}

// bytes reads a JSON string at p.i (a quote) and returns its value,
// a slice of the body when it has no escapes.
func (p *batchParser) bytes() ([]byte, error) {
	p.i++ // "
	start := p.i
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], nil
		case c == '\\':
			return p.escaped(start)
		case c < ' ':
			return nil, p.syntax("control character in a string")
		}
		p.i++
	}
	return nil, p.syntax("unterminated string")
}

// escaped finishes a string that has escapes, from its first backslash.
func (p *batchParser) escaped(start int) ([]byte, error) {
	out := append([]byte(nil), p.b[start:p.i]...)
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return out, nil
		case c < ' ':
			return nil, p.syntax("control character in a string")
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.b) {
			break
		}
		p.i += 2
		switch p.b[p.i-1] {
		case '"', '\\', '/':
			out = append(out, p.b[p.i-1])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return nil, p.syntax("bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				r2 := unicode.ReplacementChar
				if p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
					save := p.i
					p.i += 2
					if lo, ok := p.hex4(); ok {
						if d := utf16.DecodeRune(r, lo); d != unicode.ReplacementChar {
							r2 = d
						} else {
							p.i = save
						}
					} else {
						p.i = save
					}
				}
				r = r2
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, p.syntax("bad escape")
		}
	}
	return nil, p.syntax("unterminated string")
}

func (p *batchParser) hex4() (rune, bool) {
	if p.i+4 > len(p.b) {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return r, true
}

// skip reads past any JSON value, checking its syntax. depth is how many
// arrays and objects hold the value; the value may nest to MaxBatchDepth
// in all. It loops instead of recursing, with the closing brackets on a
// fixed stack, so a deep body costs neither stack nor memory.
func (p *batchParser) skip(depth int) error {
	var open [MaxBatchDepth]byte // the closing bracket of each level open here
	n := 0
	for {
		// A value.
		switch c := p.peek(); {
		case c == '"':
			if _, err := p.bytes(); err != nil {
				return err
			}
		case c == '{' || c == '[':
			if depth+n >= MaxBatchDepth {
				return p.tooDeep()
			}
			end := byte(']')
			if c == '{' {
				end = '}'
			}
			p.i++
			if p.peek() == end {
				p.i++
				break
			}
			open[n] = end
			n++
			if end == '}' {
				if err := p.key(); err != nil {
					return err
				}
			}
			continue // its first member
		case c == 't':
			if err := p.word("true"); err != nil {
				return err
			}
		case c == 'f':
			if err := p.word("false"); err != nil {
				return err
			}
		case c == 'n':
			if err := p.word("null"); err != nil {
				return err
			}
		case c == '-' || (c >= '0' && c <= '9'):
			start := p.i
			for p.i < len(p.b) && strings.IndexByte("+-.eE0123456789", p.b[p.i]) >= 0 {
				p.i++
			}
			if !json.Valid(p.b[start:p.i]) {
				return p.syntax("bad number")
			}
		default:
			return p.syntax("expected a value")
		}
		// After a value: close what ends here, or go on to the next member.
		for {
			if n == 0 {
				return nil
			}
			end := open[n-1]
			c := p.peek()
			if c == end {
				p.i++
				n--
				continue
			}
			if c != ',' {
				return p.syntax("expected , or " + string(end))
			}
			p.i++
			if end == '}' {
				if err := p.key(); err != nil {
					return err
				}
			}
			break
		}
	}
}

// key reads an object's key and its colon.
func (p *batchParser) key() error {
	if p.peek() != '"' {
		return p.syntax("expected a key")
	}
	if _, err := p.bytes(); err != nil {
		return err
	}
	if p.peek() != ':' {
		return p.syntax("expected :")
	}
	p.i++
	return nil
}

func (p *batchParser) tooDeep() error {
	return reject(CodeBadRequest, "the %s batch is nested deeper than %d levels at byte %d (an envelope needs 4): nothing of it was stored", BatchJSON, MaxBatchDepth, p.i)
}

func (p *batchParser) word(w string) error {
	if !bytes.HasPrefix(p.b[p.i:], []byte(w)) {
		return p.syntax("expected a value")
	}
	p.i += len(w)
	return nil
}
