package store

import "encoding/binary"

// A stored value is a short header the scripts write, then the encoded
// envelope. The header keeps the original due time beside the data, so a
// delivery knows its due time however often it was re-leased or retried,
// without a claims entry for every first attempt:
//
//	0xF0, due ms as 6 bytes big-endian, envelope
//
// The envelope encodings start with a small format byte (1, 2), so a value
// written before the header existed is told apart by its first byte and
// read as an envelope with an unknown due time.
const (
	valueMark   = 0xF0
	valueHeader = 7
)

// splitValue returns the due time and the envelope of a stored value; due
// is -1 for a value without the header.
func splitValue(v string) (dueMs int64, data []byte) {
	if len(v) < valueHeader || v[0] != valueMark {
		return -1, []byte(v)
	}
	var b [8]byte
	copy(b[2:], v[1:valueHeader])
	return int64(binary.BigEndian.Uint64(b[:])), []byte(v[valueHeader:])
}
