package envelope

import (
	"strings"
	"testing"
	"time"
)

func TestParseSeries(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC) // a Monday
	lim := Limits{MaxPayload: 100, MaxIDLen: 16, MaxHeaders: 16, MaxHeaderBytes: 1024, MaxDelay: 48 * time.Hour, MaxPast: time.Minute}
	h := func(kv ...string) map[string][]string {
		m := map[string][]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = append(m[kv[i]], kv[i+1])
		}
		return m
	}
	const tg = "Delayd-Target"
	ok := []struct {
		name   string
		h      map[string][]string
		at     string // the first occurrence, or the one-shot's At
		series string // the rule's String, "" for a one-shot
	}{
		{"every", h(tg, "a.b", "Delayd-Every", "1m"), "2026-11-30T10:01:00Z", "every 1m0s"},
		{"every from a future start", h(tg, "a.b", "Delayd-Every", "1h", "Delayd-Start", "2026-11-30T12:00:00Z"),
			"2026-11-30T12:00:00Z", "every 1h0m0s, start 2026-11-30T12:00:00Z"},
		{"every with every bound", h(tg, "a.b", "Delayd-Every", "25m", "Delayd-Start", "2026-11-30T09:00:00Z",
			"Delayd-Until", "2026-12-01T00:00:00Z", "Delayd-Count", "3", "Delayd-Catch-Up", "all"),
			"2026-11-30T10:15:00Z", "every 25m0s, start 2026-11-30T09:00:00Z, until 2026-12-01T00:00:00Z, count 3, catch-up all"},
		{"cron in a zone", h(tg, "a.b", "Delayd-Cron", "0 30 2 * * *", "Delayd-Time-Zone", "Europe/Berlin"),
			"2026-12-01T01:30:00Z", "cron 0 30 2 * * * in Europe/Berlin"},
		{"cron descriptor", h(tg, "a.b", "Delayd-Cron", "@hourly", "Delayd-Catch-Up", "one"), "2026-11-30T11:00:00Z", "cron @hourly"},
		{"any case", h("delayd-target", "a.b", "DELAYD-EVERY", "1m", "delayd-catch-up", "ALL"), "2026-11-30T10:01:00Z", "every 1m0s, catch-up all"},
		{"ADR-51 @every", h("Nats-Schedule-Target", "a.b", "Nats-Schedule", "@every 5m"), "2026-11-30T10:05:00Z", "every 5m0s"},
		{"ADR-51 @at is a one-shot", h("Nats-Schedule-Target", "a.b", "Nats-Schedule", "@at 2026-11-30T10:30:00Z"), "2026-11-30T10:30:00Z", ""},
		{"ADR-51 cron in a zone", h("Nats-Schedule-Target", "a.b", "Nats-Schedule", "0 0 6 * * *", "Nats-Schedule-Time-Zone", "America/New_York"),
			"2026-11-30T11:00:00Z", "cron 0 0 6 * * * in America/New_York"},
		{"ADR-51 descriptor with delayd's target and count", h(tg, "a.b", "Nats-Schedule", "@daily", "Delayd-Count", "2"),
			"2026-12-01T00:00:00Z", "cron @daily, count 2"},
		{"ADR-51 any case", h("NATS-SCHEDULE-TARGET", "a.b", "nats-schedule", "@hourly"), "2026-11-30T11:00:00Z", "cron @hourly"},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseSchedule(tc.h, nil, lim, pol, now)
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			at := r.At
			if !r.HasAt {
				// Every without Start: a delay, measured by Redis.
				at = now.Add(r.Delay)
			}
			if at.Format(time.RFC3339Nano) != tc.at || r.Target != "a.b" {
				t.Fatalf("at %v (has %v, delay %s), target %q", r.At, r.HasAt, r.Delay, r.Target)
			}
			if !r.HasAt && (r.Series == nil || r.Series.Every != r.Delay || !r.Series.Start.IsZero()) {
				t.Fatalf("a delay %s for series %v: only Every without Start is one", r.Delay, r.Series)
			}
			switch {
			case tc.series == "" && r.Series != nil:
				t.Fatalf("a one-shot got series %s", r.Series)
			case tc.series != "" && (r.Series == nil || r.Series.String() != tc.series):
				t.Fatalf("series %v, want %s", r.Series, tc.series)
			}
			if len(r.Header) != 0 {
				t.Fatalf("control headers passed through: %v", r.Header)
			}
		})
	}

	bad := []struct {
		name string
		h    map[string][]string
		want string
	}{
		{"every under 1s", h(tg, "a.b", "Delayd-Every", "500ms"), "Delayd-Every 500ms is under the minimum of 1s"},
		{"every not a duration", h(tg, "a.b", "Delayd-Every", "1 minute"), "not a duration"},
		{"every over max delay", h(tg, "a.b", "Delayd-Every", "72h"), "over the limit"},
		{"every not whole ms", h(tg, "a.b", "Delayd-Every", "1.0001s"), "whole number of milliseconds"},
		{"every and cron", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Cron", "@daily"), "exactly one of"},
		{"at and every", h(tg, "a.b", "Delayd-At", "2026-11-30T10:00:00Z", "Delayd-Every", "1m"), "exactly one of"},
		{"delay and cron", h(tg, "a.b", "Delayd-Delay", "1m", "Delayd-Cron", "@daily"), "exactly one of"},
		{"none", h(tg, "a.b"), "exactly one of"},
		{"duplicate every", h(tg, "a.b", "Delayd-Every", "1m", "delayd-every", "2m"), "exactly once"},
		{"zone with every", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Time-Zone", "Europe/Berlin"), "Delayd-Time-Zone only applies to a cron schedule, not to Delayd-Every"},
		{"zone with at", h(tg, "a.b", "Delayd-At", "2026-11-30T10:00:00Z", "Delayd-Time-Zone", "Europe/Berlin"), "only applies to a cron schedule"},
		{"unknown zone", h(tg, "a.b", "Delayd-Cron", "@daily", "Delayd-Time-Zone", "Europe/Atlantis"), "unknown time zone"},
		{"empty zone", h(tg, "a.b", "Delayd-Cron", "@daily", "Delayd-Time-Zone", ""), "Delayd-Time-Zone is empty"},
		{"five-field cron", h(tg, "a.b", "Delayd-Cron", "*/5 * * * *"), "6 fields"},
		{"bad cron field", h(tg, "a.b", "Delayd-Cron", "0 0 25 * * *"), "above maximum"},
		{"@every in cron", h(tg, "a.b", "Delayd-Cron", "@every 1m"), "use every"},
		{"never-firing cron", h(tg, "a.b", "Delayd-Cron", "0 0 0 31 4 *"), "never fires"},
		{"empty cron", h(tg, "a.b", "Delayd-Cron", " "), "Delayd-Cron is empty"},
		{"start with delay", h(tg, "a.b", "Delayd-Delay", "1m", "Delayd-Start", "2026-11-30T10:00:00Z"), "Delayd-Start only applies to a recurring schedule"},
		{"until with at", h(tg, "a.b", "Delayd-At", "2026-11-30T10:00:00Z", "Delayd-Until", "2026-11-30T10:00:00Z"), "Delayd-Until only applies"},
		{"count with delay", h(tg, "a.b", "Delayd-Delay", "1m", "Delayd-Count", "2"), "Delayd-Count only applies"},
		{"catch-up with delay", h(tg, "a.b", "Delayd-Delay", "1m", "Delayd-Catch-Up", "all"), "Delayd-Catch-Up only applies"},
		{"start not RFC 3339", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Start", "tomorrow"), "Delayd-Start \"tomorrow\" is not an RFC 3339 time"},
		{"start out of range", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Start", "2300-01-01T00:00:00Z"), "out of range"},
		{"until before start", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Start", "2026-12-01T00:00:00Z", "Delayd-Until", "2026-11-30T23:00:00Z"), "before start"},
		{"until already past", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Start", "2026-11-30T08:00:00Z", "Delayd-Until", "2026-11-30T09:00:00Z"), "has no occurrence"},
		{"count zero", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Count", "0"), "not a positive integer"},
		{"count negative", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Count", "-1"), "not a positive integer"},
		{"count not a number", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Count", "ten"), "not a positive integer"},
		{"catch-up unknown", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Catch-Up", "some"), "neither one nor all"},
		{"first beyond max delay (cron)", h(tg, "a.b", "Delayd-Cron", "@yearly"), "the first occurrence (2027-01-01T00:00:00Z) is 758h0m0s ahead, limit is 48h0m0s"},
		{"first beyond max delay (start)", h(tg, "a.b", "Delayd-Every", "1m", "Delayd-Start", "2026-12-05T00:00:00Z"), "the first occurrence"},
		{"ADR-51 with Delayd-Delay", h(tg, "a.b", "Nats-Schedule", "@every 1m", "Delayd-Delay", "1m"), "Nats-Schedule and Delayd-Delay both say when"},
		{"ADR-51 with Delayd-Cron", h(tg, "a.b", "Nats-Schedule", "@hourly", "Delayd-Cron", "@hourly"), "both say when"},
		{"both targets", h(tg, "a.b", "Nats-Schedule-Target", "a.b", "Nats-Schedule", "@hourly"), "both Delayd-Target and Nats-Schedule-Target"},
		{"ADR-51 target alone", h("Nats-Schedule-Target", "a.b", "Delayd-Delay", "1m"), "Nats-Schedule-Target is only read with Nats-Schedule"},
		{"ADR-51 zone alone", h(tg, "a.b", "Delayd-Cron", "@daily", "Nats-Schedule-Time-Zone", "UTC"), "Nats-Schedule-Time-Zone is only read with Nats-Schedule"},
		{"ADR-51 with Delayd-Time-Zone", h(tg, "a.b", "Nats-Schedule", "@daily", "Delayd-Time-Zone", "UTC"), "give the zone as Nats-Schedule-Time-Zone"},
		// As nats-server 2.15 reads them (server/scheduler.go: the rest
		// after "@at " or "@every " is parsed as it is).
		{"ADR-51 two spaces after @at", h("Nats-Schedule-Target", "a.b", "Nats-Schedule", "@at  2026-11-30T10:30:00Z"), "Nats-Schedule @at"},
		{"ADR-51 two spaces after @every", h("Nats-Schedule-Target", "a.b", "Nats-Schedule", "@every  5m"), "Nats-Schedule @every"},
		{"ADR-51 without a target", h("Nats-Schedule", "@every 5m"), "missing header Nats-Schedule-Target"},
		{"ADR-51 Local zone", h("Nats-Schedule-Target", "a.b", "Nats-Schedule", "0 0 6 * * *", "Nats-Schedule-Time-Zone", "Local"), `time zone "Local" is refused`},
		{"ADR-51 @at with zone", h(tg, "a.b", "Nats-Schedule", "@at 2026-11-30T10:30:00Z", "Nats-Schedule-Time-Zone", "UTC"), "not to Nats-Schedule @at"},
		{"ADR-51 @every with zone", h(tg, "a.b", "Nats-Schedule", "@every 1m", "Nats-Schedule-Time-Zone", "UTC"), "not to Nats-Schedule @every"},
		{"ADR-51 @every under 1s", h(tg, "a.b", "Nats-Schedule", "@every 500ms"), "Nats-Schedule @every 500ms is under the minimum"},
		{"ADR-51 @at malformed", h(tg, "a.b", "Nats-Schedule", "@at tomorrow"), "Nats-Schedule @at \"tomorrow\" is not an RFC 3339 time"},
		{"ADR-51 @at too far in the past", h(tg, "a.b", "Nats-Schedule", "@at 2026-11-30T09:00:00Z"), "in the past"},
		{"ADR-51 empty", h(tg, "a.b", "Nats-Schedule", ""), "Nats-Schedule is empty"},
		{"ADR-51 five fields", h(tg, "a.b", "Nats-Schedule", "*/5 * * * *"), "6 fields"},
		{"ADR-51 source", h(tg, "a.b", "Nats-Schedule", "@hourly", "Nats-Schedule-Source", "x.y"), "Nats-Schedule-Source is not supported by delayd"},
		{"ADR-51 TTL", h(tg, "a.b", "Nats-Schedule", "@hourly", "Nats-Schedule-TTL", "1h"), "Nats-Schedule-TTL is not supported by delayd"},
		{"ADR-51 rollup", h(tg, "a.b", "Nats-Schedule", "@hourly", "nats-schedule-rollup", "sub"), "nats-schedule-rollup is not supported by delayd"},
		{"Nats-Scheduler", h(tg, "a.b", "Delayd-Delay", "1m", "Nats-Scheduler", "x"), "Nats-Scheduler is not supported by delayd"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSchedule(tc.h, nil, lim, pol, now)
			if CodeOf(err) != CodeBadRequest || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want 400 containing %q", err, tc.want)
			}
		})
	}
}

// An operator's allow list does not let the ADR-51 family through to the
// target: delayd reads it (or refuses it) before that check.
func TestNATSScheduleNotPassedThrough(t *testing.T) {
	allow := Policy{Prefix: "delayd", AllowNATS: []string{"Nats-Schedule-TTL"}}
	_, err := ParseSchedule(map[string][]string{"Delayd-Target": {"a.b"}, "Delayd-Delay": {"1m"}, "Nats-Schedule-TTL": {"1h"}},
		nil, lim, allow, time.Now())
	if CodeOf(err) != CodeBadRequest || !strings.Contains(err.Error(), "not supported by delayd") {
		t.Fatalf("got %v", err)
	}
}
