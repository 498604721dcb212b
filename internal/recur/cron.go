package recur

import (
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
)

// parser reads 6 fields, seconds first, and the descriptors (@yearly,
// @annually, @monthly, @weekly, @daily, @midnight, @hourly): the syntax of
// NATS message schedules (ADR-51).
var parser = cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// schedule is a parsed cron spec and its zone.
//
// robfig/cron's SpecSchedule.Next walks the zone's local time by adding
// instants, which goes wrong at DST changes: a local time skipped by a
// spring-forward change (02:30 in New York on the second Sunday of March)
// never matches, so that day has no occurrence; a local time repeated by a
// fall-back change matches on both passes, so it fires twice. So the match is
// searched in wall-clock time instead, where robfig is exact: the spec runs
// in UTC on the zone's wall clock written as a UTC time, and each matching
// wall time is then mapped to an instant by instant below: a repeated one to
// its first pass, a skipped one to the end of the gap (the next valid
// instant). Matches that map to the same instant are one occurrence.
type schedule struct {
	spec *cron.SpecSchedule // Location UTC: it walks naive wall times
	loc  *time.Location
}

// next returns the first occurrence after t.
func (s schedule) next(t time.Time) (time.Time, bool) {
	w := wall(t, s.loc)
	for w.Before(maxTime) {
		n := s.spec.Next(w)
		if n.IsZero() {
			// robfig gives up after five years without a match; a spec that
			// Validate accepted has one in every leap year, but 2100 is none.
			w = time.Date(w.Year()+5, time.December, 31, 23, 59, 59, 0, time.UTC)
			continue
		}
		if at := instant(n, s.loc); at.After(t) {
			return at, true
		}
		w = n // the second pass of a repeated hour: its matches fired on the first
	}
	return time.Time{}, false
}

// wall is t's wall clock in loc, written as a UTC time.
func wall(t time.Time, loc *time.Location) time.Time {
	_, off := t.In(loc).Zone()
	return t.UTC().Add(time.Duration(off) * time.Second)
}

// instant maps a wall time in loc (written as a UTC time) to the instant it
// stands for: the earlier of two for a time repeated by a fall-back change,
// the end of the gap for a time skipped by a spring-forward change.
// time.Date leaves both cases unspecified, so they are resolved here from the
// offsets in force a day either side (no zone changes twice in two days).
func instant(w time.Time, loc *time.Location) time.Time {
	_, before := w.Add(-26 * time.Hour).In(loc).Zone()
	_, after := w.Add(26 * time.Hour).In(loc).Zone()
	early := w.Add(-time.Duration(before) * time.Second)
	late := w.Add(-time.Duration(after) * time.Second)
	earlyOK := offset(early, loc) == before
	lateOK := offset(late, loc) == after
	switch {
	case earlyOK && lateOK:
		if late.Before(early) {
			return late
		}
		return early
	case earlyOK:
		return early
	case lateOK:
		return late
	}
	// In the gap: early, read with the old offset, already lies past the
	// change, so its zone period starts at the change.
	if start, _ := early.In(loc).ZoneBounds(); !start.IsZero() {
		return start.UTC()
	}
	return early
}

func offset(t time.Time, loc *time.Location) int {
	_, off := t.In(loc).Zone()
	return off
}

// neverProbe is where Validate looks for a first match: robfig searches five
// years, and 2000 to 2005 holds two Feb 29ths, so a spec with no match there
// has none ever.
var neverProbe = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// cache keeps parsed specs and loaded zones: Next runs for every occurrence
// delivered, and loading a zone reads and parses tzdata.
var cache struct {
	sync.Mutex
	m map[[2]string]schedule
}

const cacheMax = 4096

// compile parses spec and loads zone, with errors fit for a publisher.
func compile(spec, zone string) (schedule, error) {
	key := [2]string{spec, zone}
	cache.Lock()
	s, ok := cache.m[key]
	cache.Unlock()
	if ok {
		return s, nil
	}
	switch {
	case len(spec) > MaxSpecLen:
		return s, invalid("cron spec is %d bytes, limit is %d", len(spec), MaxSpecLen)
	case strings.HasPrefix(spec, "@every"):
		return s, invalid("cron %q: use every for a fixed period, not @every in cron", spec)
	case strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ="):
		// Also keeps robfig from slicing out of range on "TZ=x" without a space.
		return s, invalid("cron %q: give the time zone on its own, not in the spec", spec)
	}
	parsed, err := parser.Parse(spec)
	if err != nil {
		return s, invalid("cron %q: %v (want 6 fields, seconds first, or @yearly, @monthly, @weekly, @daily, @hourly)", spec, err)
	}
	ss, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return s, invalid("cron %q is not a calendar spec", spec)
	}
	ss.Location = time.UTC
	if ss.Next(neverProbe).IsZero() {
		return s, invalid("cron %q never fires (no date matches it)", spec)
	}
	s = schedule{spec: ss, loc: time.UTC}
	if zone != "" {
		if zone == "Local" {
			// nats-server reads it as its own zone; delayd's daemons may
			// run in different zones, and a series must not move with
			// the daemon that happens to claim it.
			return s, invalid("time zone \"Local\" is refused: daemons may run in different zones; name the zone, like Europe/Berlin or UTC")
		}
		if len(zone) > maxZoneLen {
			return s, invalid("unknown time zone %q", zone)
		}
		if s.loc, err = time.LoadLocation(zone); err != nil {
			return s, invalid("unknown time zone %q: want an IANA name like Europe/Berlin", zone)
		}
	}
	cache.Lock()
	if len(cache.m) >= cacheMax || cache.m == nil {
		cache.m = make(map[[2]string]schedule)
	}
	cache.m[key] = s
	cache.Unlock()
	return s, nil
}
