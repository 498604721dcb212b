package envelope

import (
	"strconv"
	"strings"
	"time"

	"github.com/delayd/delayd/internal/recur"
)

// when is how a request says when to deliver, with the ADR-51 aliases
// mapped: kind is slotAt, slotDelay, slotEvery or slotCron, value its
// header's value, and name the header it came from, for messages.
type when struct {
	kind        int
	name, value string
	zone        string
	zoneName    string // "": no time zone header
}

func (w when) series() bool { return w.kind == slotEvery || w.kind == slotCron }

// target returns the target, from Delayd-Target or its ADR-51 alias.
func (c control) target() (string, error) {
	t, ok := c.get(slotTarget)
	nt, nok := c.get(slotNATSTarget)
	switch {
	case ok && nok:
		return "", reject(CodeBadRequest, "both %s and %s name the target: use one", HeaderTarget, HeaderNATSScheduleTarget)
	case nok && !c.seen[slotNATSSchedule]:
		return "", reject(CodeBadRequest, "%s is only read with %s", HeaderNATSScheduleTarget, HeaderNATSSchedule)
	case nok:
		return nt, nil
	}
	return t, nil
}

// when finds the one header that says when to deliver and checks that the
// headers which only qualify a series come with one.
func (c control) when() (when, error) {
	var w when
	n := 0
	for _, slot := range []int{slotAt, slotDelay, slotEvery, slotCron} {
		if v, ok := c.get(slot); ok {
			n++
			w = when{kind: slot, name: controlNames[slot], value: v}
		}
	}
	if v, ok := c.get(slotNATSSchedule); ok {
		if n > 0 {
			return w, reject(CodeBadRequest, "%s and %s both say when to deliver: use one", HeaderNATSSchedule, w.name)
		}
		n++
		w = natsSchedule(v)
	}
	if n != 1 {
		return w, reject(CodeBadRequest, "exactly one of %s, %s, %s and %s (or %s) is required",
			HeaderAt, HeaderDelay, HeaderEvery, HeaderCron, HeaderNATSSchedule)
	}

	tz, hasTZ := c.get(slotTimeZone)
	ntz, hasNTZ := c.get(slotNATSTimeZone)
	switch {
	case hasNTZ && !c.seen[slotNATSSchedule]:
		return w, reject(CodeBadRequest, "%s is only read with %s", HeaderNATSScheduleTimeZone, HeaderNATSSchedule)
	case hasTZ && c.seen[slotNATSSchedule]:
		return w, reject(CodeBadRequest, "with %s give the zone as %s, not %s", HeaderNATSSchedule, HeaderNATSScheduleTimeZone, HeaderTimeZone)
	case hasNTZ:
		w.zone, w.zoneName = ntz, HeaderNATSScheduleTimeZone
	case hasTZ:
		w.zone, w.zoneName = tz, HeaderTimeZone
	}
	if w.zoneName != "" && w.kind != slotCron {
		// As in NATS: an absolute time or an elapsed period has no zone.
		return w, reject(CodeBadRequest, "%s only applies to a cron schedule, not to %s", w.zoneName, w.name)
	}
	if !w.series() {
		for _, slot := range []int{slotStart, slotUntil, slotCount, slotCatchUp} {
			if c.seen[slot] {
				return w, reject(CodeBadRequest, "%s only applies to a recurring schedule (%s or %s), not to %s",
					controlNames[slot], HeaderEvery, HeaderCron, w.name)
			}
		}
	}
	return w, nil
}

// natsSchedule maps an ADR-51 Nats-Schedule value, as nats-server reads it:
// "@at <RFC 3339>", "@every <duration>", else a 6-field cron spec or one
// of its descriptors. Like nats-server, exactly one space follows the
// keyword: the rest is parsed as it is, so "@at  2026-..." is refused.
func natsSchedule(v string) when {
	switch {
	case strings.HasPrefix(v, "@at "):
		return when{kind: slotAt, name: HeaderNATSSchedule + " @at", value: v[len("@at "):]}
	case strings.HasPrefix(v, "@every "):
		return when{kind: slotEvery, name: HeaderNATSSchedule + " @every", value: v[len("@every "):]}
	}
	return when{kind: slotCron, name: HeaderNATSSchedule, value: v}
}

// parseSeries reads the rule of a recurring schedule into r, with its first
// occurrence as r.At.
func parseSeries(r *Request, c control, w when, lim Limits, now time.Time) error {
	var rule recur.Rule
	if w.kind == slotEvery {
		d, err := time.ParseDuration(w.value)
		switch {
		case err != nil:
			return reject(CodeBadRequest, "%s %s is not a duration like 1m or 1h30m", w.name, Quote(w.value))
		case d < recur.MinEvery:
			return reject(CodeBadRequest, "%s %s is under the minimum of %s", w.name, d, recur.MinEvery)
		case d > lim.MaxDelay:
			return reject(CodeBadRequest, "%s %s is over the limit of %s", w.name, d, lim.MaxDelay)
		}
		rule.Every = d
	} else {
		if w.value == "" {
			return reject(CodeBadRequest, "%s is empty", w.name)
		}
		if w.zoneName != "" && w.zone == "" {
			return reject(CodeBadRequest, "%s is empty", w.zoneName)
		}
		rule.Cron, rule.Zone = w.value, w.zone
	}
	var err error
	if v, ok := c.get(slotStart); ok {
		if rule.Start, err = parseBound(HeaderStart, v); err != nil {
			return err
		}
	}
	if v, ok := c.get(slotUntil); ok {
		if rule.Until, err = parseBound(HeaderUntil, v); err != nil {
			return err
		}
	}
	if v, ok := c.get(slotCount); ok {
		if rule.Count, err = strconv.ParseInt(v, 10, 64); err != nil || rule.Count <= 0 {
			return reject(CodeBadRequest, "%s %s is not a positive integer", HeaderCount, Quote(v))
		}
	}
	if v, ok := c.get(slotCatchUp); ok {
		if rule.CatchUp, err = recur.ParseCatchUp(v); err != nil {
			return reject(CodeBadRequest, "%s %s is neither one nor all", HeaderCatchUp, Quote(v))
		}
	}
	if err := rule.Validate(); err != nil {
		return reject(CodeBadRequest, "%v", err)
	}
	first, ok := rule.First(now)
	if !ok {
		return reject(CodeBadRequest, "the series %s has no occurrence from now on", rule)
	}
	if err := inRange("the first occurrence", first); err != nil {
		return err
	}
	if d := first.Sub(now); d > lim.MaxDelay {
		return reject(CodeBadRequest, "the first occurrence (%s) is %s ahead, limit is %s",
			first.Format(time.RFC3339Nano), d.Round(time.Second), lim.MaxDelay)
	}
	r.At, r.HasAt, r.Series = first, true, &rule
	if rule.Every > 0 && rule.Start.IsZero() {
		// Now + Every is a delay: Redis' clock makes it, as for
		// Delayd-Delay, so a daemon with a skewed clock cannot fire early.
		r.At, r.HasAt, r.Delay = time.Time{}, false, rule.Every
	}
	return nil
}

func parseBound(name, v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return t, reject(CodeBadRequest, "%s %s is not an RFC 3339 time", name, Quote(v))
	}
	return t, inRange(name, t)
}
