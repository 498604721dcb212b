// Package recur owns recurrence rules: when the occurrences of a recurring
// schedule are due, how a series ends, and how one is caught up after delayd
// was away.
//
// Occurrences are whole milliseconds (the store keeps due times in ms), in
// UTC. Every rounding goes up, never down: delayd promises never early.
package recur

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // zones must load on machines without zoneinfo (distroless, scratch)
)

// CatchUp says what a series does when occurrences were missed because no
// delayd ran when they fell due.
type CatchUp uint8

const (
	// One delivers one late occurrence for all that were missed, then goes on
	// with the first occurrence after now, in the schedule's phase.
	One CatchUp = iota
	// All delivers every missed occurrence, one after another (a burst).
	All
)

// ParseCatchUp reads "one" or "all", ignoring case.
func ParseCatchUp(s string) (CatchUp, error) {
	switch {
	case strings.EqualFold(s, "one"):
		return One, nil
	case strings.EqualFold(s, "all"):
		return All, nil
	}
	return One, fmt.Errorf("catch-up %q is neither one nor all", s)
}

func (c CatchUp) String() string {
	switch c {
	case One:
		return "one"
	case All:
		return "all"
	}
	return "catch-up(" + strconv.Itoa(int(c)) + ")"
}

// Rule is a recurrence rule: exactly one of Every and Cron, and optional
// bounds.
type Rule struct {
	// Every is a fixed period of elapsed time, at least MinEvery and a whole
	// number of milliseconds. Its phase is Start, else the first occurrence.
	Every time.Duration
	// Cron is a spec of 6 fields, seconds first, or a descriptor such as
	// @daily. @every is not accepted here: that is Every.
	Cron string
	// Zone is the IANA time zone Cron is read in; "" means UTC. Only for Cron.
	Zone string
	// Start is the earliest an occurrence may be due; zero means none.
	Start time.Time
	// Until is the latest an occurrence may be due, inclusive; zero means none.
	Until time.Time
	// Count is the number of occurrences to deliver; 0 means unlimited.
	Count int64
	// CatchUp says what happens to occurrences missed while delayd was away.
	CatchUp CatchUp
}

// Bounds of a rule.
const (
	MinEvery   = time.Second
	maxEvery   = 100 * 365 * 24 * time.Hour // keeps every sum of times inside time.Duration
	MaxSpecLen = 256
	maxZoneLen = 128
)

// Every time a rule handles lies in [minTime, maxTime): the store's due time
// range (envelope.MinDue, MaxDue). A series that would go past maxTime ends.
var (
	minTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// ErrInvalid is wrapped by every error of Validate and Decode.
var ErrInvalid = errors.New("invalid recurrence rule")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Validate checks the rule: the cron spec parses and fires at some time, the
// zone loads, and the bounds are consistent.
func (r Rule) Validate() error {
	switch {
	case r.Every != 0 && r.Cron != "":
		return invalid("both every and cron are set; a rule has exactly one")
	case r.Every == 0 && r.Cron == "":
		return invalid("neither every nor cron is set; a rule has exactly one")
	}
	if r.Cron == "" {
		switch {
		case r.Every < MinEvery:
			return invalid("every %s is under the minimum of %s", r.Every, MinEvery)
		case r.Every > maxEvery:
			return invalid("every %s is over the maximum of %s", r.Every, maxEvery)
		case r.Every%time.Millisecond != 0:
			return invalid("every %s is not a whole number of milliseconds", r.Every)
		case r.Zone != "":
			return invalid("time zone %q only applies to cron; every counts elapsed time", r.Zone)
		}
	} else if _, err := compile(r.Cron, r.Zone); err != nil {
		return err
	}
	for _, b := range []struct {
		name string
		t    time.Time
	}{{"start", r.Start}, {"until", r.Until}} {
		if !b.t.IsZero() && (b.t.Before(minTime) || !b.t.Before(maxTime)) {
			return invalid("%s %s is out of range: it must lie between %s and %s", b.name, b.t.Format(time.RFC3339Nano),
				minTime.Format(time.RFC3339), maxTime.Format(time.RFC3339))
		}
	}
	switch {
	case !r.Start.IsZero() && !r.Until.IsZero() && r.Until.Before(r.Start):
		return invalid("until %s is before start %s", r.Until.Format(time.RFC3339Nano), r.Start.Format(time.RFC3339Nano))
	case r.Count < 0:
		return invalid("count %d is negative", r.Count)
	case r.CatchUp > All:
		return invalid("unknown %s", r.CatchUp)
	}
	return nil
}

// First returns the due time of the first occurrence for a series created
// at now, or false if there is none (it would be after Until).
//
// Every: Start if it is not before now; a Start in the past is kept as the
// phase and the first Start + k*Every not before now is due; without Start,
// now + Every. Cron: the first match not before Start if Start is not before
// now, else the first match after now.
func (r Rule) First(now time.Time) (time.Time, bool) {
	if r.Validate() != nil {
		return time.Time{}, false
	}
	var t time.Time
	switch {
	case r.Cron != "":
		from := now
		if !r.Start.IsZero() && !r.Start.Before(now) {
			from = r.Start.Add(-time.Nanosecond) // a match at Start itself counts
		}
		var ok bool
		if t, ok = r.cronAfter(from); !ok {
			return time.Time{}, false
		}
	case r.Start.IsZero():
		t = time.UnixMilli(ceilMs(now.Add(r.Every)))
	default:
		start, nowMs, every := ceilMs(r.Start), ceilMs(now), r.Every.Milliseconds()
		if start >= nowMs {
			t = time.UnixMilli(start)
		} else {
			k := (nowMs - start + every - 1) / every
			t = time.UnixMilli(start + k*every)
		}
	}
	return r.within(t)
}

// Next returns the due time of the occurrence after the one due at prevDue,
// where delivered is the number of occurrences delivered so far (the one due
// at prevDue included). It returns false when the series is over: Count
// reached, or the next occurrence after Until.
//
// With CatchUp One, an occurrence after prevDue that is already due at now
// was missed (no delayd ran); the late one just delivered stands for all of
// them, and the series goes on with the first occurrence after now. With All
// it goes on with the occurrence after prevDue, however late.
func (r Rule) Next(prevDue, now time.Time, delivered int64) (time.Time, bool) {
	if r.Validate() != nil || (r.Count > 0 && delivered >= r.Count) {
		return time.Time{}, false
	}
	t, ok := r.after(prevDue, prevDue)
	if ok && r.CatchUp == One && !t.After(now) {
		t, ok = r.after(prevDue, now)
	}
	if !ok {
		return time.Time{}, false
	}
	return r.within(t)
}

// after returns the first occurrence after t; an Every series is in the
// phase of phase.
func (r Rule) after(phase, t time.Time) (time.Time, bool) {
	if r.Cron != "" {
		return r.cronAfter(t)
	}
	p, every := ceilMs(phase), r.Every.Milliseconds()
	// p + k*every > t  <=>  p + k*every > floor(t in ms), both sides integers.
	tMs := floorMs(t)
	if tMs < p {
		return time.UnixMilli(p + every), true
	}
	return time.UnixMilli(p + ((tMs-p)/every+1)*every), true
}

func (r Rule) cronAfter(t time.Time) (time.Time, bool) {
	c, err := compile(r.Cron, r.Zone)
	if err != nil {
		return time.Time{}, false
	}
	return c.next(t)
}

// within applies the bounds common to every rule: Until and the store's range.
func (r Rule) within(t time.Time) (time.Time, bool) {
	if (!r.Until.IsZero() && t.After(r.Until)) || t.Before(minTime) || !t.Before(maxTime) {
		return time.Time{}, false
	}
	return t.UTC(), true
}

// String renders the rule for people (delayd get, the console), e.g.
// "cron 0 */5 * * * * in Europe/Berlin, until 2026-12-31T00:00:00Z, count 10".
func (r Rule) String() string {
	var b strings.Builder
	if r.Cron != "" {
		b.WriteString("cron " + r.Cron)
		if r.Zone != "" {
			b.WriteString(" in " + r.Zone)
		}
	} else {
		b.WriteString("every " + r.Every.String())
	}
	if !r.Start.IsZero() {
		b.WriteString(", start " + r.Start.UTC().Format(time.RFC3339Nano))
	}
	if !r.Until.IsZero() {
		b.WriteString(", until " + r.Until.UTC().Format(time.RFC3339Nano))
	}
	if r.Count > 0 {
		b.WriteString(", count " + strconv.FormatInt(r.Count, 10))
	}
	if r.CatchUp != One {
		b.WriteString(", catch-up " + r.CatchUp.String())
	}
	return b.String()
}

// ceilMs is t in ms since the epoch, rounded up.
func ceilMs(t time.Time) int64 {
	ms := t.UnixMilli()
	if time.UnixMilli(ms).Before(t) {
		ms++
	}
	return ms
}

// floorMs is t in ms since the epoch, rounded down.
func floorMs(t time.Time) int64 {
	ms := t.UnixMilli()
	if time.UnixMilli(ms).After(t) { // UnixMilli truncates toward zero
		ms--
	}
	return ms
}
