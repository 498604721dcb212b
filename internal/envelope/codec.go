package envelope

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"time"

	"github.com/delayd/delayd/internal/recur"
)

// Envelope is what is stored and later delivered: the target and the
// payload with the headers that travel with it, and for a recurring
// schedule its rule.
type Envelope struct {
	Target  string
	Header  map[string][]string
	Series  *recur.Rule // nil for a one-shot
	Payload []byte
	// Stored is when an envelope accepted with a due time already past
	// was stored (zero otherwise): its lateness counts from then, not
	// from a due time hours ago. It travels in the stored value as the
	// header headerStored, which Decode takes out again.
	Stored time.Time
	// Request is the fingerprint of the request that scheduled it
	// (Request.Fingerprint), kept for a one-shot with a publisher's id
	// while resends are remembered (intake.dedupe_window): once delivered,
	// the id's tombstone holds it, and a resend of the same request is
	// answered instead of scheduled again. It travels in the stored value
	// as the header headerRequest, which Decode takes out again.
	Request string
	// Jitter is the request's Delayd-Jitter: each occurrence is due
	// JitterOffset after its unjittered time. It travels in the stored
	// value as the header headerJitter (ms), which Decode takes out again.
	Jitter time.Duration
}

// headerStored carries Envelope.Stored in a stored value. No request can
// set it (unknown Delayd-* headers are refused) and Decode removes it, so
// it never reaches a target; a format-2 reader that predates it (an older
// daemon during an upgrade) delivers it as a plain header.
const headerStored = "Delayd-Stored"

// headerRequest carries Envelope.Request (hex) in a stored value, like
// headerStored: no request can set it, and Decode removes it.
const headerRequest = "Delayd-Request"

// headerJitter carries Envelope.Jitter (ms) in a stored value, like
// headerStored. Not the request's Delayd-Jitter, so that a reader that
// predates it shows it as what it is.
const headerJitter = "Delayd-Jitter-Ms"

// Layout of the stored value, format 2:
//
//	[0]     format byte (2)
//	uvarint len(target), target
//	uvarint number of header keys; per key: uvarint len, key, uvarint
//	        number of values; per value: uvarint len, value
//	uvarint len(series), series: recur.Rule.Encode; 0 for a one-shot
//	payload: the rest, unframed
//
// Format 1 (still decoded) had 8 random version bytes after the format byte
// and no series. Nothing reads them since the store settles by claim token,
// so format 2 leaves them out. The id and due time are not repeated here:
// they are the hash field and ZSET score.
const (
	formatV1  = 1
	formatV2  = 2
	v1Version = 8 // format 1's unused version bytes
)

// ErrCorrupt is returned for a stored value that cannot be decoded.
var ErrCorrupt = errors.New("envelope: corrupt or unknown encoding")

// Encode returns the stored form of e, in format 2. A Series must be valid.
func Encode(e Envelope) []byte {
	if !e.Stored.IsZero() || e.Request != "" || e.Jitter > 0 {
		h := make(map[string][]string, len(e.Header)+3)
		maps.Copy(h, e.Header)
		if !e.Stored.IsZero() {
			h[headerStored] = []string{strconv.FormatInt(e.Stored.UnixMilli(), 10)}
		}
		if e.Request != "" {
			h[headerRequest] = []string{hex.EncodeToString([]byte(e.Request))}
		}
		if e.Jitter > 0 {
			h[headerJitter] = []string{strconv.FormatInt(e.Jitter.Milliseconds(), 10)}
		}
		e.Header = h
	}
	var series []byte
	if e.Series != nil {
		series = e.Series.Encode()
	}
	n := 1 + 3*binary.MaxVarintLen64 + len(e.Target) + len(series) + len(e.Payload)
	for k, vs := range e.Header {
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	b := make([]byte, 1, n)
	b[0] = formatV2
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
	b = binary.AppendUvarint(b, uint64(len(series)))
	b = append(b, series...)
	return append(b, e.Payload...)
}

// Decode parses a stored value of format 1 or 2. The payload aliases b.
func Decode(b []byte) (Envelope, error) {
	var e Envelope
	var r reader
	switch {
	case len(b) >= 1+v1Version && b[0] == formatV1:
		r.b = b[1+v1Version:]
	case len(b) >= 1 && b[0] == formatV2:
		r.b = b[1:]
	default:
		return e, ErrCorrupt
	}
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
	if b[0] == formatV2 {
		if series := r.bytes(); r.err == nil && len(series) > 0 {
			rule, err := recur.Decode(series)
			if err != nil {
				return Envelope{}, fmt.Errorf("%w: series: %v", ErrCorrupt, err)
			}
			e.Series = &rule
		}
	}
	if r.err != nil {
		return Envelope{}, r.err
	}
	if vs, ok := e.Header[headerStored]; ok {
		ms, err := strconv.ParseInt(vs[0], 10, 64)
		if len(vs) != 1 || err != nil || ms <= 0 || strconv.FormatInt(ms, 10) != vs[0] {
			return Envelope{}, fmt.Errorf("%w: %s %q", ErrCorrupt, headerStored, vs)
		}
		e.Stored = time.UnixMilli(ms)
		if delete(e.Header, headerStored); len(e.Header) == 0 {
			e.Header = nil
		}
	}
	if vs, ok := e.Header[headerRequest]; ok {
		fp, err := hex.DecodeString(vs[0])
		if len(vs) != 1 || err != nil || len(fp) != fingerprintLen {
			return Envelope{}, fmt.Errorf("%w: %s %q", ErrCorrupt, headerRequest, vs)
		}
		e.Request = string(fp)
		if delete(e.Header, headerRequest); len(e.Header) == 0 {
			e.Header = nil
		}
	}
	if vs, ok := e.Header[headerJitter]; ok {
		ms, err := strconv.ParseInt(vs[0], 10, 64)
		if len(vs) != 1 || err != nil || ms <= 0 || strconv.FormatInt(ms, 10) != vs[0] {
			return Envelope{}, fmt.Errorf("%w: %s %q", ErrCorrupt, headerJitter, vs)
		}
		e.Jitter = time.Duration(ms) * time.Millisecond
		if delete(e.Header, headerJitter); len(e.Header) == 0 {
			e.Header = nil
		}
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

func (r *reader) str() string { return string(r.bytes()) }

// bytes returns a length-prefixed field; it aliases the input.
func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = ErrCorrupt
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// FormatMs renders a time in ms since the epoch the way the protocol writes
// times (Delayd-Due, deliver_at, inspection replies): RFC 3339 nano, UTC.
func FormatMs(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }

// Delivery is a due envelope on its way to its target.
type Delivery struct {
	ID      string
	Due     time.Time
	Attempt int
	// Occurrence is which occurrence of a series this is (from 1), 0 for
	// a one-shot.
	Occurrence int64
	// Allowed is when flow control let it go (a rate limit's slot, or the
	// end of a pause), if it held it past its due time; zero otherwise.
	Allowed time.Time
	Envelope
}

// LateSince is what a delivery's lateness counts from: its due time, or
// when it was stored if that is later (a Delayd-At accepted in the past
// is late only by the time delayd took, not by its age), or when flow
// control let it go if that is later still (the wait a limit or a pause
// imposed is the operator's, measured apart: flow.Observer).
func (d Delivery) LateSince() time.Time {
	t := d.Due
	if d.Stored.After(t) {
		t = d.Stored
	}
	if d.Allowed.After(t) {
		t = d.Allowed
	}
	return t
}
