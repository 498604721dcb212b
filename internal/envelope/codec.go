package envelope

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sort"
	"time"
)

// Envelope is what is stored and later delivered: the target and the
// payload with the headers that travel with it.
type Envelope struct {
	Target  string
	Header  map[string][]string
	Payload []byte
}

// Layout of the stored value, format 1:
//
//	[0]     format byte (1)
//	[1:9]   version: 8 random bytes, new for every upsert
//	uvarint len(target), target
//	uvarint number of header keys; per key: uvarint len, key, uvarint
//	        number of values; per value: uvarint len, value
//	payload: the rest, unframed
//
// The store's Lua scripts compare bytes [1:9] (Lua's string.sub(v, 2, 9)) so
// that an ack never deletes a newer envelope stored under the same id. The id
// and due time are not repeated here: they are the hash field and ZSET score.
const (
	formatV1    = 1
	VersionSize = 8
	headerSize  = 1 + VersionSize
)

// ErrCorrupt is returned for a stored value that cannot be decoded.
var ErrCorrupt = errors.New("envelope: corrupt or unknown encoding")

// Encode returns the stored form of e with a fresh random version.
func Encode(e Envelope) []byte {
	n := headerSize + binary.MaxVarintLen64 + len(e.Target) + binary.MaxVarintLen64 + len(e.Payload)
	for k, vs := range e.Header {
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	b := make([]byte, headerSize, n)
	b[0] = formatV1
	// The version only has to differ between two upserts of one id, not be
	// secret, so the fast per-process ChaCha8 generator serves.
	binary.LittleEndian.PutUint64(b[1:headerSize], rand.Uint64())
	b = appendString(b, e.Target)
	b = binary.AppendUvarint(b, uint64(len(e.Header)))
	// Sorted keys make the encoding deterministic, which the fuzz round
	// trip and byte-level comparisons rely on.
	keys := make([]string, 0, len(e.Header))
	for k := range e.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b = appendString(b, k)
		vs := e.Header[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return append(b, e.Payload...)
}

// Version returns the version bytes of a stored value, or nil if it is too
// short to have one.
func Version(b []byte) []byte {
	if len(b) < headerSize {
		return nil
	}
	return b[1:headerSize]
}

// Decode parses a stored value. The payload aliases b.
func Decode(b []byte) (Envelope, error) {
	var e Envelope
	if len(b) < headerSize || b[0] != formatV1 {
		return e, ErrCorrupt
	}
	r := reader{b: b[headerSize:]}
	e.Target = r.str()
	nk := r.uvarint()
	if nk > uint64(len(r.b)) { // each key needs at least one byte
		return e, ErrCorrupt
	}
	if nk > 0 {
		e.Header = make(map[string][]string, nk)
	}
	for i := uint64(0); i < nk && r.err == nil; i++ {
		k := r.str()
		nv := r.uvarint()
		if nv > uint64(len(r.b)) {
			return e, ErrCorrupt
		}
		vs := make([]string, 0, nv)
		for j := uint64(0); j < nv && r.err == nil; j++ {
			vs = append(vs, r.str())
		}
		if _, dup := e.Header[k]; dup {
			return e, ErrCorrupt
		}
		e.Header[k] = vs
	}
	if r.err != nil {
		return Envelope{}, r.err
	}
	e.Payload = r.b
	return e, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = ErrCorrupt
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) str() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.err = ErrCorrupt
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// FormatMs renders a time in ms since the epoch the way the protocol writes
// times (Delayd-Due, deliver_at, inspection replies): RFC 3339 nano, UTC.
func FormatMs(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }

// Delivery is a due envelope on its way to its target.
type Delivery struct {
	ID      string
	Due     time.Time
	Attempt int
	Envelope
}
