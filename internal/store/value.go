package store

import "encoding/binary"

// A stored value is a short header the scripts write, then the encoded
// envelope. The header keeps the original due time beside the data, so a
// delivery knows its due time however often it was re-leased or retried,
// without an attempts entry for every first attempt; for a recurring series
// it also keeps which occurrence is pending:
//
//	0xF0, due ms as 6 bytes big-endian, envelope                (one-shot)
//	0xF1, due ms as 6 bytes, occurrence as 4 bytes, envelope    (series)
//
// The envelope encodings start with a small format byte (1, 2), so a value
// written before the header existed (format 1, retired) is told apart by
// its first byte.
const (
	valueMark         = 0xF0
	valueHeader       = 7
	seriesMark        = 0xF1
	seriesValueHeader = 11
)

// Stored formats. A format is a version of what the scripts write: the
// values, since format 3 the lease scores, and since format 4 where
// pending envelopes are indexed (docs/architecture.md has their table). A
// value's format is told by its first byte: below 0xF0 an envelope
// without the header (format 1), 0xF0 and 0xF1 the header, which formats 2
// to 4 share, and each later format that changes the layout takes the next
// pair of marks (markOf). Formats 1 and 2 are retired: no release wrote
// them, the scripts read neither, a daemon refuses to start on data that
// may hold them (schema.go), and delayd migrate moves them. A daemon reads
// every format from 3 up to the newest it knows, and writes the newest
// that every live daemon reads (AgreeFormats), so a rolling upgrade that
// brings a new format never meets a daemon that cannot read what it
// finds; a daemon that meets a newer value format anyway (a rollback)
// leaves it alone.
const (
	// FormatUnreadable counts, in Formats, the values that are no
	// envelope of any format this version reads: corrupt, or written by
	// something else than delayd.
	FormatUnreadable = 0
	// FormatBare is the envelope alone, written by builds before the
	// value header, with attempts values "attempt:due:token" and lease
	// scores the expiry in whole ms. Retired: delayd migrate stamps such
	// a value with the header (schema.go).
	FormatBare = 1
	// FormatHeader is the header above, with lease scores the lease
	// expiry ms plus the fraction k/1000 (0.1.0 and the builds up to
	// 5f3b025). Retired: delayd migrate rewrites such a score as its
	// token; its values are format 3's.
	FormatHeader = 2
	// FormatIntegerLeases keeps format 2's values, and writes each lease
	// score as its claim's token, a whole number (keys.go, inflight),
	// instead of the lease expiry plus a fraction: the oldest format this
	// version reads.
	FormatIntegerLeases = 3
	// FormatDueBuckets kept format 3's values and lease scores, and
	// indexed pending envelopes in small sorted sets, the due buckets
	// (keys.go, pending), written by builds before 0.2.0 with their opt-in
	// redis.due_buckets. Retired: less memory than the due set, but more
	// Redis work per schedule and claim, and a second index every script
	// had to merge (docs/BENCHMARKS.md); a daemon refuses to start on data
	// that holds them, and delayd migrate moves them to the due set.
	FormatDueBuckets = 4
	// formatNext stands in for a future format in tests of mixed-version
	// fleets (WithNewestFormat): format 3's layout under marks 0xF2, 0xF3.
	formatNext = 5
)

// newestFormat is the newest format this version announces and writes
// (tests raise it with WithNewestFormat).
const newestFormat = FormatIntegerLeases

// formatOf is the stored format of a value: for the header that formats 2
// to 4 share, 3, the one this version reads.
func formatOf(v string) int {
	if len(v) == 0 || v[0] < valueMark {
		return FormatBare
	}
	if pair := int(v[0]-valueMark) / 2; pair > 0 {
		return FormatDueBuckets + pair
	}
	return FormatIntegerLeases
}

// markOf is the one-shot mark of the values of format f (3 or later).
func markOf(f int) byte {
	if f <= FormatDueBuckets {
		return valueMark
	}
	return valueMark + byte(2*(f-FormatDueBuckets))
}

// splitValue returns the due time, the occurrence (0 for a one-shot) and
// the envelope of a stored value; due is -1 for a value without the header.
// Formats 3 and formatNext share the layout; a newer format is returned
// whole, with due -1 (it is never claimed, and fails to decode where it is
// read).
func splitValue(v string) (dueMs, occurrence int64, data []byte) {
	if f := formatOf(v); f == FormatIntegerLeases || f == formatNext {
		switch {
		case len(v) >= valueHeader && (v[0]-valueMark)%2 == 0:
			return be(v[1:7]), 0, []byte(v[valueHeader:])
		case len(v) >= seriesValueHeader:
			return be(v[1:7]), be(v[7:11]), []byte(v[seriesValueHeader:])
		}
	}
	return -1, 0, []byte(v)
}

// be reads a big-endian number of up to 8 bytes.
func be(s string) int64 {
	var b [8]byte
	copy(b[8-len(s):], s)
	return int64(binary.BigEndian.Uint64(b[:]))
}

// stampValue builds a stored value of the format with one-shot mark: the
// header for dueMs (with the occurrence, if > 0, for a series), then data.
// The scripts build the same (stamp in lua/prelude.lua) when only Redis knows
// the due time.
func stampValue(mark byte, dueMs, occurrence int64, data []byte) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(dueMs))
	if occurrence > 0 {
		v := make([]byte, 0, seriesValueHeader+len(data))
		v = append(append(append(v, mark+1), b[2:]...), byte(occurrence>>24), byte(occurrence>>16), byte(occurrence>>8), byte(occurrence))
		return append(v, data...)
	}
	v := make([]byte, 0, valueHeader+len(data))
	return append(append(append(v, mark), b[2:]...), data...)
}

// ceilMs is µs rounded up to the ms, as the schedule script rounds: a due
// time is never early.
func ceilMs(us int64) int64 {
	ms := us / 1000
	if us%1000 > 0 {
		ms++
	}
	return ms
}
