package envelope

// The batch body's JSON, read by hand (batch.go says why): the parser's
// position, white space, strings with their escapes, and the values it
// skips.

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

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
