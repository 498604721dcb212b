package recur

import (
	"encoding/binary"
	"time"
)

// Layout of an encoded rule, format 1:
//
//	[0]  format byte (1)
//	[1]  flags: kindCron, hasZone, hasStart, hasUntil, hasCount, catchUpAll
//	every: uvarint period in ms | cron: uvarint len, spec
//	hasZone:  uvarint len, zone
//	hasStart: varint ns since the epoch
//	hasUntil: varint ns since the epoch
//	hasCount: uvarint count
//
// Times keep their nanoseconds, so a rule decodes to what was encoded (in
// UTC); absent fields take no bytes.
const (
	codecV1 = 1

	kindCron   = 1 << 0
	hasZone    = 1 << 1
	hasStart   = 1 << 2
	hasUntil   = 1 << 3
	hasCount   = 1 << 4
	catchUpAll = 1 << 5
	knownFlags = kindCron | hasZone | hasStart | hasUntil | hasCount | catchUpAll
)

// Encode returns the stored form of r, which must be valid. It is
// deterministic: equal rules encode to equal bytes.
func (r Rule) Encode() []byte {
	var flags byte
	b := make([]byte, 2, 2+binary.MaxVarintLen64*4+len(r.Cron)+len(r.Zone))
	b[0] = codecV1
	if r.Cron != "" {
		flags |= kindCron
		b = binary.AppendUvarint(b, uint64(len(r.Cron)))
		b = append(b, r.Cron...)
	} else {
		b = binary.AppendUvarint(b, uint64(r.Every.Milliseconds()))
	}
	if r.Zone != "" {
		flags |= hasZone
		b = binary.AppendUvarint(b, uint64(len(r.Zone)))
		b = append(b, r.Zone...)
	}
	if !r.Start.IsZero() {
		flags |= hasStart
		b = binary.AppendVarint(b, r.Start.UnixNano())
	}
	if !r.Until.IsZero() {
		flags |= hasUntil
		b = binary.AppendVarint(b, r.Until.UnixNano())
	}
	if r.Count > 0 {
		flags |= hasCount
		b = binary.AppendUvarint(b, uint64(r.Count))
	}
	if r.CatchUp == All {
		flags |= catchUpAll
	}
	b[1] = flags
	return b
}

// Decode parses an encoded rule and validates it: a rule it returns is safe
// to use. It never panics on arbitrary input.
func Decode(b []byte) (Rule, error) {
	var r Rule
	if len(b) < 2 || b[0] != codecV1 || b[1]&^knownFlags != 0 {
		return r, invalid("unknown encoding")
	}
	flags := b[1]
	d := decoder{b: b[2:]}
	if flags&kindCron != 0 {
		r.Cron = d.str()
	} else if ms := d.uvarint(); ms <= uint64(maxEvery.Milliseconds()) {
		r.Every = time.Duration(ms) * time.Millisecond
	} else {
		d.bad = true
	}
	if flags&hasZone != 0 {
		r.Zone = d.str()
	}
	if flags&hasStart != 0 {
		r.Start = time.Unix(0, d.varint()).UTC()
	}
	if flags&hasUntil != 0 {
		r.Until = time.Unix(0, d.varint()).UTC()
	}
	if flags&hasCount != 0 {
		n := d.uvarint()
		r.Count = int64(n)
		if n == 0 || r.Count < 0 {
			d.bad = true
		}
	}
	if flags&catchUpAll != 0 {
		r.CatchUp = All
	}
	if d.bad || len(d.b) != 0 || (flags&hasZone != 0 && r.Zone == "") {
		return Rule{}, invalid("corrupt encoding")
	}
	if err := r.Validate(); err != nil {
		return Rule{}, err
	}
	return r, nil
}

type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) str() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.bad = true
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
