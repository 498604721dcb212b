// Package envelope owns the delayed envelope: its protocol headers, their
// validation against the configured limits, and its compact binary encoding.
package envelope

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Protocol header names. Control headers are matched case-insensitively on
// intake; the delivered headers are written with exactly these spellings.
const (
	HeaderTarget  = "Delayd-Target"
	HeaderAt      = "Delayd-At"
	HeaderDelay   = "Delayd-Delay"
	HeaderID      = "Delayd-Id"
	HeaderDue     = "Delayd-Due"
	HeaderAttempt = "Delayd-Attempt"
	// HeaderOccurrence numbers the deliveries of a recurring series, from 1.
	HeaderOccurrence = "Delayd-Occurrence"
	// HeaderJitter spreads the delivery over [due, due + jitter) (JitterOffset).
	HeaderJitter  = "Delayd-Jitter"
	HeaderError   = "Delayd-Error" // on dead letters: the last delivery error
	controlPrefix = "delayd-"

	// A recurring schedule (a series) has Delayd-Every or Delayd-Cron
	// instead of Delayd-At or Delayd-Delay, and these only with one of them.
	HeaderEvery    = "Delayd-Every"
	HeaderCron     = "Delayd-Cron"
	HeaderTimeZone = "Delayd-Time-Zone"
	HeaderStart    = "Delayd-Start"
	HeaderUntil    = "Delayd-Until"
	HeaderCount    = "Delayd-Count"
	HeaderCatchUp  = "Delayd-Catch-Up"

	// The NATS message schedule headers (ADR-51) delayd reads as aliases of
	// its own; every other header of that family is refused.
	HeaderNATSSchedule         = "Nats-Schedule"
	HeaderNATSScheduleTarget   = "Nats-Schedule-Target"
	HeaderNATSScheduleTimeZone = "Nats-Schedule-Time-Zone"
	// natsSchedulePrefix covers Nats-Schedule, Nats-Schedule-* and Nats-Scheduler.
	natsSchedulePrefix = "nats-schedule"

	// natsPrefix starts the headers the NATS server and JetStream act on
	// (Nats-Msg-Id, Nats-Rollup, Nats-Expected-*, Nats-TTL, ...).
	natsPrefix = "nats-"
)

// Codes follow the HTTP-like convention of NATS micro errors.
const (
	CodeBadRequest  = 400
	CodeForbidden   = 403
	CodeConflict    = 409 // an operator request the fleet cannot carry out now
	CodeTooLarge    = 413
	CodeUnavailable = 503
)

// Error is a rejection of a request with a code the caller can branch on.
type Error struct {
	Code int
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

func reject(code int, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// QuoteMax bounds the bytes of a publisher's value an error quotes: a
// refusal names the value without echoing a megabyte of it, and a batch's
// reply, one refusal per envelope, stays small (docs/protocol.md).
const QuoteMax = 64

// Quote is s quoted as %q does, cut to its first QuoteMax bytes (on a rune
// boundary) and marked "…" when longer.
func Quote(s string) string {
	if len(s) > QuoteMax {
		cut := QuoteMax
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return strconv.Quote(s)
}

// CodeOf returns the protocol code of err: the code of an *Error, else 503,
// because anything else is the store or the network failing, not the caller.
func CodeOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeUnavailable
}

// Due times must lie in [MinDue, MaxDue): then every due time in µs is
// exact in Redis' Lua numbers (doubles, exact to 2^53) and every distance
// from now fits a time.Duration.
var (
	MinDue = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxDue = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// MaxDelayLimit bounds limits.max_delay (and max_past): 100 years keeps
// now + delay far inside MaxDue for this century.
const MaxDelayLimit = 100 * 365 * 24 * time.Hour

// Limits bound what one request may carry. Zero means "no limit" only for
// MaxPast; every other limit must be positive (config validation ensures it).
type Limits struct {
	MaxPayload     int
	MaxIDLen       int
	MaxHeaders     int
	MaxHeaderBytes int
	MaxDelay       time.Duration
	// MaxPast is how far in the past a Delayd-At may lie; older times are
	// rejected as a likely clock or format bug. Within it, due at once.
	MaxPast time.Duration
	// MaxJitter bounds Delayd-Jitter.
	MaxJitter time.Duration
}

// Request is a validated schedule request.
type Request struct {
	ID string // empty: the daemon assigns one
	// Envelope.Series is the rule of a recurring schedule, nil for a one-shot.
	Envelope
	// Exactly one of At (absolute) and Delay (relative to Redis time) is
	// used. A series has HasAt, and At is its first occurrence.
	At    time.Time
	Delay time.Duration
	HasAt bool
}

// fingerprintLen is the length of a request's fingerprint: 64 bits of
// SHA-256, as the tombstone of a delivered id keeps it.
const fingerprintLen = 8

// Fingerprint identifies what the request asks for: its target, payload,
// the headers that travel, a series' rule, and its Delayd-At time or
// Delayd-Delay duration as given (so a relative delay resent later still
// matches). Not the id, and not when it was accepted. Two requests with
// the same fingerprint are one request sent twice.
func (r Request) Fingerprint() string {
	h := sha256.New()
	field := func(s string) {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	field(r.Target)
	keys := slices.Sorted(maps.Keys(r.Header))
	field(strconv.Itoa(len(keys)))
	for _, k := range keys {
		field(k)
		field(strconv.Itoa(len(r.Header[k])))
		for _, v := range r.Header[k] {
			field(v)
		}
	}
	if r.Series != nil {
		field("series:" + r.Series.String())
	}
	if r.Jitter > 0 {
		// Only then: the fingerprints of requests without one, which
		// tombstones hold, stay what they were.
		field("jitter:" + strconv.FormatInt(int64(r.Jitter), 10))
	}
	if r.HasAt {
		field("at:" + strconv.FormatInt(r.At.UnixNano(), 10))
	} else {
		field("delay:" + strconv.FormatInt(int64(r.Delay), 10))
	}
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(r.Payload)))])
	h.Write(r.Payload)
	return string(h.Sum(nil)[:fingerprintLen])
}

// storedAfter is how far in the past a Delayd-At must lie for the envelope
// to carry the time it was accepted (Envelope.Stored): lateness then counts
// from that time. Due times are Redis time and now is the local clock, so a
// time just past (or a clock ahead of Redis) keeps its due time as the
// start of its lateness.
const storedAfter = time.Second

// ParseSchedule validates the headers and payload of a schedule request.
// now is used for the coarse limit checks on Delayd-At and for the first
// occurrence of a series; a Delayd-Delay's due time is computed in Redis.
func ParseSchedule(h map[string][]string, payload []byte, lim Limits, pol Policy, now time.Time) (Request, error) {
	var r Request
	if len(payload) > lim.MaxPayload {
		return r, reject(CodeTooLarge, "payload is %d bytes, limit is %d", len(payload), lim.MaxPayload)
	}
	ctl, pass, err := splitHeaders(h, lim)
	if err != nil {
		return r, err
	}
	r.Payload = payload
	r.Header = pass

	if r.Target, err = ctl.target(); err != nil {
		return r, err
	}
	switch {
	case r.Target == "" && ctl.seen[slotNATSSchedule]:
		// The ADR-51 family names its target with its own header.
		return r, reject(CodeBadRequest, "missing header %s (or %s)", HeaderNATSScheduleTarget, HeaderTarget)
	case r.Target == "":
		return r, reject(CodeBadRequest, "missing header %s", HeaderTarget)
	case !ValidTarget(r.Target):
		return r, reject(CodeBadRequest, "%s %s is not a literal subject (no wildcards, empty tokens or spaces)", HeaderTarget, Quote(r.Target))
	}
	if err := pol.Check(r.Target); err != nil {
		return r, err
	}
	if err := pol.checkNATSHeaders(pass); err != nil {
		return r, err
	}

	if id, ok := ctl.get(slotID); ok {
		if err := validID(id, lim.MaxIDLen); err != nil {
			return r, err
		}
		r.ID = id
	}

	if v, ok := ctl.get(slotJitter); ok {
		if r.Jitter, err = parseJitter(v, lim.MaxJitter); err != nil {
			return r, err
		}
	}

	w, err := ctl.when()
	if err != nil {
		return r, err
	}
	if err := parseWhen(&r, ctl, w, lim, now); err != nil {
		return r, err
	}
	if r.Jitter > 0 {
		// The offset is added once the id is known (JitterOffset); even
		// the largest must keep the due time in range.
		latest := r.At
		if !r.HasAt {
			latest = now.Add(r.Delay)
		}
		if err := inRange("the due time plus "+HeaderJitter, latest.Add(r.Jitter)); err != nil {
			return r, err
		}
	}
	return r, nil
}

// parseWhen reads when to deliver into r: At or Delay, and a series' rule.
func parseWhen(r *Request, ctl control, w when, lim Limits, now time.Time) error {
	switch {
	case w.series():
		return parseSeries(r, ctl, w, lim, now)
	case w.kind == slotAt:
		t, err := time.Parse(time.RFC3339Nano, w.value)
		if err != nil {
			return reject(CodeBadRequest, "%s %s is not an RFC 3339 time", w.name, Quote(w.value))
		}
		if err := inRange(w.name, t); err != nil {
			return err
		}
		if d := t.Sub(now); d > lim.MaxDelay {
			return reject(CodeBadRequest, "%s is %s ahead, limit is %s", w.name, d.Round(time.Second), lim.MaxDelay)
		}
		if lim.MaxPast > 0 && now.Sub(t) > lim.MaxPast {
			return reject(CodeBadRequest, "%s is %s in the past, limit is %s", w.name, now.Sub(t).Round(time.Second), lim.MaxPast)
		}
		r.At, r.HasAt = t, true
		if now.Sub(t) > storedAfter {
			r.Stored = now
		}
	default:
		d, err := time.ParseDuration(w.value)
		switch {
		case err != nil:
			return reject(CodeBadRequest, "%s %s is not a duration like 30m or 1500ms", HeaderDelay, Quote(w.value))
		case d < 0:
			return reject(CodeBadRequest, "%s %s is negative", HeaderDelay, Quote(w.value))
		case d > lim.MaxDelay:
			return reject(CodeBadRequest, "%s %s is over the limit of %s", HeaderDelay, d, lim.MaxDelay)
		}
		r.Delay = d
	}
	return nil
}

func parseJitter(v string, max time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return 0, reject(CodeBadRequest, "%s %s is not a duration like 2s or 1500ms", HeaderJitter, Quote(v))
	case d < time.Millisecond:
		return 0, reject(CodeBadRequest, "%s %s must be positive, at least 1ms", HeaderJitter, Quote(v))
	case d > max:
		return 0, reject(CodeBadRequest, "%s %s is over the limit of %s", HeaderJitter, d, max)
	}
	// Offsets are whole ms (JitterOffset), and so is the stored jitter.
	return d.Truncate(time.Millisecond), nil
}

// inRange checks a due time (or a series bound) against [MinDue, MaxDue):
// outside, due times stop fitting a ZSET score (or the µs Redis computes
// with) exactly, and durations from now overflow.
func inRange(name string, t time.Time) error {
	if t.Before(MinDue) || !t.Before(MaxDue) {
		return reject(CodeBadRequest, "%s %s is out of range: it must lie between %s and %s", name, t.Format(time.RFC3339Nano),
			MinDue.Format(time.RFC3339), MaxDue.Format(time.RFC3339))
	}
	return nil
}

// ParseID validates the Delayd-Id of a cancel (or lookup) request.
func ParseID(h map[string][]string, lim Limits) (string, error) {
	ctl, _, err := splitHeaders(h, lim)
	if err != nil {
		return "", err
	}
	id, ok := ctl.get(slotID)
	if !ok {
		return "", reject(CodeBadRequest, "missing header %s", HeaderID)
	}
	return id, validID(id, lim.MaxIDLen)
}

// checkNATSHeaders refuses Nats-* pass-through headers not listed in
// AllowNATS. delayd publishes with its own NATS rights, so such a header
// from a publisher would make a stream act on delayd's authority: roll up
// (purge) a subject, forge a deduplication id, set a TTL. The Nats-Schedule
// family (ADR-51) never gets here: splitHeaders takes it out as control
// headers, aliases of delayd's or refused.
func (p Policy) checkNATSHeaders(pass map[string][]string) error {
next:
	for k := range pass {
		if !HasPrefixFold(k, natsPrefix) {
			continue
		}
		for _, a := range p.AllowNATS {
			if strings.EqualFold(k, a) {
				continue next
			}
		}
		return reject(CodeBadRequest, "header %s is refused: Nats-* headers are set by delayd or by the operator (headers.allow_nats), not by publishers", Quote(k))
	}
	return nil
}

// IsNATSHeader reports whether k is in the Nats-* family, which the NATS
// server and JetStream act on: only delayd (or an operator's allow list)
// may set those on what delayd publishes.
func IsNATSHeader(k string) bool { return HasPrefixFold(k, natsPrefix) }

// HasPrefixFold is strings.HasPrefix, ignoring ASCII case.
func HasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func validID(id string, max int) error {
	switch {
	case id == "":
		return reject(CodeBadRequest, "%s is empty", HeaderID)
	case len(id) > max:
		return reject(CodeBadRequest, "%s is %d bytes, limit is %d", HeaderID, len(id), max)
	case !utf8.ValidString(id):
		return reject(CodeBadRequest, "%s is not valid UTF-8", HeaderID)
	}
	for _, c := range id {
		if c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) {
			return reject(CodeBadRequest, "%s contains a control character", HeaderID)
		}
	}
	return nil
}

// control holds the control headers of a request: Delayd-* and the
// Nats-Schedule family. A fixed struct rather than a map: this runs for
// every request.
type control struct {
	vals [numSlots]string
	seen [numSlots]bool
}

// controlNames are the control headers a request may carry, in slot order.
var controlNames = [numSlots]string{
	HeaderTarget, HeaderAt, HeaderDelay, HeaderID, HeaderJitter,
	HeaderEvery, HeaderCron, HeaderTimeZone, HeaderStart, HeaderUntil, HeaderCount, HeaderCatchUp,
	HeaderNATSSchedule, HeaderNATSScheduleTarget, HeaderNATSScheduleTimeZone,
}

// controlSlots finds a control header spelled as the protocol spells it
// (as nats.go's canonical header keys are) without comparing against every
// name; other spellings fall back to a case-insensitive search.
var controlSlots = func() map[string]int {
	m := make(map[string]int, numSlots)
	for i, name := range controlNames {
		m[name] = i
	}
	return m
}()

const (
	slotTarget = iota
	slotAt
	slotDelay
	slotID
	slotJitter
	slotEvery
	slotCron
	slotTimeZone
	slotStart
	slotUntil
	slotCount
	slotCatchUp
	slotNATSSchedule
	slotNATSTarget
	slotNATSTimeZone
	numSlots
)

func (c control) get(slot int) (string, bool) { return c.vals[slot], c.seen[slot] }

// splitHeaders separates the control headers from the headers that travel
// with the payload, enforcing the header count and size limits.
func splitHeaders(h map[string][]string, lim Limits) (control, map[string][]string, error) {
	var ctl control
	var pass map[string][]string
	count, size := 0, 0
	for k, vs := range h {
		count += len(vs)
		size += len(k) * len(vs)
		for _, v := range vs {
			size += len(v)
		}
		if count > lim.MaxHeaders {
			return ctl, nil, reject(CodeTooLarge, "more than %d header values", lim.MaxHeaders)
		}
		if size > lim.MaxHeaderBytes {
			return ctl, nil, reject(CodeTooLarge, "headers exceed %d bytes", lim.MaxHeaderBytes)
		}
		delayd, sched := HasPrefixFold(k, controlPrefix), HasPrefixFold(k, natsSchedulePrefix)
		if delayd || sched {
			slot, ok := controlSlots[k]
			if !ok {
				slot = -1
				for i, name := range controlNames {
					if strings.EqualFold(k, name) {
						slot = i
						break
					}
				}
			}
			switch {
			case slot < 0 && delayd:
				return ctl, nil, reject(CodeBadRequest, "unknown control header %s", Quote(k))
			case slot < 0:
				return ctl, nil, reject(CodeBadRequest, "%s is not supported by delayd: of the NATS message schedule headers (ADR-51) it reads %s, %s and %s",
					k, HeaderNATSSchedule, HeaderNATSScheduleTarget, HeaderNATSScheduleTimeZone)
			case ctl.seen[slot] || len(vs) != 1:
				return ctl, nil, reject(CodeBadRequest, "header %s must appear exactly once", controlNames[slot])
			}
			ctl.vals[slot], ctl.seen[slot] = strings.TrimSpace(vs[0]), true
			continue
		}
		if pass == nil {
			pass = make(map[string][]string, len(h))
		}
		pass[k] = vs
	}
	return ctl, pass, nil
}

// Redacted is what a redacted header value is shown as.
const Redacted = "REDACTED"

// RedactHeaders returns a copy of h in which the values of the headers
// named in names (matched case-insensitively) are replaced by Redacted.
// Everything that shows a stored envelope's headers to a person (the
// console, delayd get, logs) goes through it: those headers carry
// credentials.
func RedactHeaders(h map[string][]string, names []string) map[string][]string {
	if h == nil {
		return nil
	}
	out := make(map[string][]string, len(h))
	for k, vs := range h {
		out[k] = vs
		for _, n := range names {
			if strings.EqualFold(k, n) {
				red := make([]string, len(vs))
				for i := range red {
					red[i] = Redacted
				}
				out[k] = red
				break
			}
		}
	}
	return out
}
