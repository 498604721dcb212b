package recur

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func ts(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// series lists the first n due times of r for a series created at now, each
// delivered on time, in the given zone's local time, and "end" if the series
// ends before n.
func series(t *testing.T, r Rule, now time.Time, n int, zone string) []string {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	due, ok := r.First(now)
	for i := int64(1); ok && len(out) < n; i++ {
		if due.Nanosecond()%int(time.Millisecond) != 0 || due.Location() != time.UTC {
			t.Fatalf("occurrence %v is not whole ms in UTC", due)
		}
		out = append(out, due.In(loc).Format("2006-01-02 15:04:05.000 MST"))
		due, ok = r.Next(due, due, i)
	}
	if !ok && len(out) < n {
		out = append(out, "end")
	}
	return out
}

func TestEvery(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 500_000, time.UTC) // 10:00:00.0005
	cases := []struct {
		name string
		r    Rule
		want []string
	}{
		{"no start: now+every, rounded up to ms", Rule{Every: time.Minute},
			[]string{"2026-11-30 10:01:00.001 UTC", "2026-11-30 10:02:00.001 UTC", "2026-11-30 10:03:00.001 UTC"}},
		{"future start", Rule{Every: time.Hour, Start: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
			[]string{"2026-12-01 00:00:00.000 UTC", "2026-12-01 01:00:00.000 UTC"}},
		{"future start with µs rounds up", Rule{Every: time.Second, Start: time.Date(2026, 12, 1, 0, 0, 0, 1000, time.UTC)},
			[]string{"2026-12-01 00:00:00.001 UTC", "2026-12-01 00:00:01.001 UTC"}},
		{"past start keeps its phase", Rule{Every: 7 * time.Minute, Start: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)},
			[]string{"2026-11-30 10:03:00.000 UTC", "2026-11-30 10:10:00.000 UTC"}},
		{"until inclusive", Rule{Every: time.Minute, Start: time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC), Until: time.Date(2026, 11, 30, 10, 3, 0, 0, time.UTC)},
			[]string{"2026-11-30 10:01:00.000 UTC", "2026-11-30 10:02:00.000 UTC", "2026-11-30 10:03:00.000 UTC", "end"}},
		{"until a ms before", Rule{Every: time.Minute, Start: time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC), Until: time.Date(2026, 11, 30, 10, 2, 59, 999e6, time.UTC)},
			[]string{"2026-11-30 10:01:00.000 UTC", "2026-11-30 10:02:00.000 UTC", "end"}},
		{"count", Rule{Every: time.Second, Count: 2}, []string{"2026-11-30 10:00:01.001 UTC", "2026-11-30 10:00:02.001 UTC", "end"}},
		{"past until: none", Rule{Every: time.Minute, Start: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC), Until: time.Date(2026, 11, 30, 9, 30, 0, 0, time.UTC)}, []string{"end"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := series(t, tc.r, now, len(tc.want), "UTC"); strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestStartEqualsNow(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for _, r := range []Rule{{Every: time.Minute, Start: now}, {Cron: "0 0 10 * * *", Start: now}} {
		if got, ok := r.First(now); !ok || !got.Equal(now) {
			t.Errorf("%s: first %v %v, want now", r, got, ok)
		}
	}
	// Without Start a cron match at now itself is not the first: it is "after now".
	if got, _ := (Rule{Cron: "0 0 10 * * *"}).First(now); !got.Equal(now.AddDate(0, 0, 1)) {
		t.Errorf("first %v", got)
	}
}

func TestCronUTC(t *testing.T) {
	now := ts(t, "2026-11-30T10:00:00.5Z")
	cases := []struct {
		name string
		r    Rule
		want []string
	}{
		{"every 5 minutes", Rule{Cron: "0 */5 * * * *"}, []string{"2026-11-30 10:05:00.000 UTC", "2026-11-30 10:10:00.000 UTC"}},
		{"@hourly", Rule{Cron: "@hourly"}, []string{"2026-11-30 11:00:00.000 UTC", "2026-11-30 12:00:00.000 UTC"}},
		{"@monthly", Rule{Cron: "@monthly"}, []string{"2026-12-01 00:00:00.000 UTC", "2027-01-01 00:00:00.000 UTC"}},
		{"names and ?", Rule{Cron: "0 0 9 ? JAN,DEC MON"}, []string{"2026-12-07 09:00:00.000 UTC", "2026-12-14 09:00:00.000 UTC"}},
		{"start: first match at or after it", Rule{Cron: "30 * * * * *", Start: ts(t, "2026-12-01T00:00:30Z")},
			[]string{"2026-12-01 00:00:30.000 UTC", "2026-12-01 00:01:30.000 UTC"}},
		{"past start is ignored", Rule{Cron: "0 0 * * * *", Start: ts(t, "2026-01-01T00:30:00Z")}, []string{"2026-11-30 11:00:00.000 UTC"}},
		{"until inclusive", Rule{Cron: "0 0 * * * *", Until: ts(t, "2026-11-30T12:00:00Z")},
			[]string{"2026-11-30 11:00:00.000 UTC", "2026-11-30 12:00:00.000 UTC", "end"}},
		{"until exclusive edge", Rule{Cron: "0 0 * * * *", Until: ts(t, "2026-11-30T11:59:59.999Z")}, []string{"2026-11-30 11:00:00.000 UTC", "end"}},
		{"count", Rule{Cron: "@daily", Count: 3}, []string{"2026-12-01 00:00:00.000 UTC", "2026-12-02 00:00:00.000 UTC", "2026-12-03 00:00:00.000 UTC", "end"}},
		{"leap day across 2100", Rule{Cron: "0 0 0 29 2 *", Start: ts(t, "2097-01-01T00:00:00Z")}, []string{"2104-02-29 00:00:00.000 UTC", "2108-02-29 00:00:00.000 UTC"}},
		{"series ends before 2200", Rule{Cron: "@yearly", Start: ts(t, "2198-06-01T00:00:00Z")}, []string{"2199-01-01 00:00:00.000 UTC", "end"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := series(t, tc.r, now, len(tc.want), "UTC"); strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// The DST rule: a local time skipped by a spring-forward change fires once, at
// the end of the gap; a local time repeated by a fall-back change fires once,
// on its first pass. robfig/cron alone skips the first and fires the second twice.
func TestCronDST(t *testing.T) {
	cases := []struct {
		zone, spec, now string
		want            []string
	}{
		// America/New_York: 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST.
		{"America/New_York", "0 30 2 * * *", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08 03:00:00.000 EDT", "2026-03-09 02:30:00.000 EDT"}},
		{"America/New_York", "0 30 1 * * *", "2026-10-31T12:00:00Z",
			[]string{"2026-11-01 01:30:00.000 EDT", "2026-11-02 01:30:00.000 EST"}},
		{"America/New_York", "0 * * * * *", "2026-03-08T06:58:30Z",
			[]string{"2026-03-08 01:59:00.000 EST", "2026-03-08 03:00:00.000 EDT", "2026-03-08 03:01:00.000 EDT"}},
		{"America/New_York", "0 * * * * *", "2026-11-01T05:58:30Z",
			[]string{"2026-11-01 01:59:00.000 EDT", "2026-11-01 02:00:00.000 EST", "2026-11-01 02:01:00.000 EST"}},
		// Created during the second pass of the repeated hour: its minutes already fired.
		{"America/New_York", "0 * * * * *", "2026-11-01T06:30:00Z",
			[]string{"2026-11-01 02:00:00.000 EST"}},
		// Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST; 2026-10-25 03:00 CEST -> 02:00 CET.
		{"Europe/Berlin", "0 30 2 * * *", "2026-03-28T12:00:00Z",
			[]string{"2026-03-29 03:00:00.000 CEST", "2026-03-30 02:30:00.000 CEST"}},
		{"Europe/Berlin", "0 30 2 * * *", "2026-10-24T12:00:00Z",
			[]string{"2026-10-25 02:30:00.000 CEST", "2026-10-26 02:30:00.000 CET"}},
		{"Europe/Berlin", "0 * * * * *", "2026-03-29T00:58:30Z",
			[]string{"2026-03-29 01:59:00.000 CET", "2026-03-29 03:00:00.000 CEST", "2026-03-29 03:01:00.000 CEST"}},
		{"Europe/Berlin", "0 * * * * *", "2026-10-25T00:58:30Z",
			[]string{"2026-10-25 02:59:00.000 CEST", "2026-10-25 03:00:00.000 CET", "2026-10-25 03:01:00.000 CET"}},
		// Australia/Sydney: 2026-10-04 02:00 AEST -> 03:00 AEDT; 2026-04-05 03:00 AEDT -> 02:00 AEST.
		{"Australia/Sydney", "0 30 2 * * *", "2026-10-03T00:00:00Z",
			[]string{"2026-10-04 03:00:00.000 AEDT", "2026-10-05 02:30:00.000 AEDT"}},
		{"Australia/Sydney", "0 30 2 * * *", "2026-04-04T00:00:00Z",
			[]string{"2026-04-05 02:30:00.000 AEDT", "2026-04-06 02:30:00.000 AEST"}},
		{"Australia/Sydney", "0 * * * * *", "2026-10-03T15:58:30Z",
			[]string{"2026-10-04 01:59:00.000 AEST", "2026-10-04 03:00:00.000 AEDT", "2026-10-04 03:01:00.000 AEDT"}},
		{"Australia/Sydney", "0 * * * * *", "2026-04-04T15:58:30Z",
			[]string{"2026-04-05 02:59:00.000 AEDT", "2026-04-05 03:00:00.000 AEST", "2026-04-05 03:01:00.000 AEST"}},
	}
	for _, tc := range cases {
		t.Run(tc.zone+" "+tc.spec+" "+tc.now, func(t *testing.T) {
			r := Rule{Cron: tc.spec, Zone: tc.zone}
			if got := series(t, r, ts(t, tc.now), len(tc.want), tc.zone); strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// Over a whole year, a daily spec fires once on every local day, and an
// hourly spec 24 times a day, except the spring-forward day: its skipped
// 02:00 folds into the 03:00 at the end of the gap (23).
func TestCronDSTYear(t *testing.T) {
	for _, zone := range []string{"America/New_York", "Europe/Berlin", "Australia/Sydney"} {
		loc, _ := time.LoadLocation(zone)
		start, end := time.Date(2026, 1, 1, 0, 0, 0, 0, loc), time.Date(2027, 1, 1, 0, 0, 0, 0, loc)
		for _, tc := range []struct {
			spec    string
			perDay  int
			springs int
		}{{"0 30 2 * * *", 1, 1}, {"@hourly", 24, 23}} {
			r := Rule{Cron: tc.spec, Zone: zone}
			perDay := map[string]int{}
			prev := time.Time{}
			due, ok := r.First(start.Add(-time.Nanosecond))
			for i := int64(1); ok && due.Before(end); i++ {
				if !due.After(prev) {
					t.Fatalf("%s %s: %v after %v", zone, tc.spec, due, prev)
				}
				perDay[due.In(loc).Format("2006-01-02")]++
				prev = due
				due, ok = r.Next(due, due, i)
			}
			if len(perDay) != 365 {
				t.Errorf("%s %s: %d days with occurrences", zone, tc.spec, len(perDay))
			}
			odd := 0
			for day, n := range perDay {
				if n != tc.perDay {
					odd++
					if n != tc.springs {
						t.Errorf("%s %s: %d occurrences on %s", zone, tc.spec, n, day)
					}
				}
			}
			if want := map[bool]int{true: 0, false: 1}[tc.perDay == tc.springs]; odd != want {
				t.Errorf("%s %s: %d days off the usual count, want %d", zone, tc.spec, odd, want)
			}
		}
	}
}

func TestCatchUp(t *testing.T) {
	prev := ts(t, "2026-11-30T10:00:00Z")
	now := ts(t, "2026-11-30T11:00:30Z") // every delayd was down for an hour
	for _, base := range []Rule{{Every: time.Minute}, {Cron: "0 * * * * *"}} {
		one, all := base, base
		all.CatchUp = All
		if got, ok := one.Next(prev, now, 1); !ok || !got.Equal(ts(t, "2026-11-30T11:01:00Z")) {
			t.Errorf("%s: one: %v %v", one, got, ok)
		}
		if got, ok := all.Next(prev, now, 1); !ok || !got.Equal(ts(t, "2026-11-30T10:01:00Z")) {
			t.Errorf("%s: all: %v %v", all, got, ok)
		}
		// On time: both go on with the next in phase.
		if got, _ := one.Next(prev, prev.Add(40*time.Millisecond), 1); !got.Equal(ts(t, "2026-11-30T10:01:00Z")) {
			t.Errorf("%s: on time: %v", one, got)
		}
	}
	// Every keeps its phase through a catch-up.
	r := Rule{Every: 7 * time.Second}
	if got, _ := r.Next(prev, now, 1); !got.Equal(ts(t, "2026-11-30T11:00:33Z")) { // 10:00 + 519*7s
		t.Errorf("phase lost: %v", got)
	}
	// Caught up past Until: the series is over.
	r = Rule{Every: time.Minute, Until: ts(t, "2026-11-30T10:30:00Z")}
	if got, ok := r.Next(prev, now, 1); ok {
		t.Errorf("past until: %v", got)
	}
}

func TestCount(t *testing.T) {
	r := Rule{Every: time.Minute, Count: 3}
	prev := ts(t, "2026-11-30T10:00:00Z")
	if _, ok := r.Next(prev, prev, 2); !ok {
		t.Error("third occurrence missing")
	}
	if got, ok := r.Next(prev, prev, 3); ok {
		t.Errorf("a fourth occurrence: %v", got)
	}
}

func TestValidate(t *testing.T) {
	start := ts(t, "2026-11-30T10:00:00Z")
	cases := []struct {
		name string
		r    Rule
		want string // "" = valid
	}{
		{"every", Rule{Every: time.Second}, ""},
		{"cron with zone and bounds", Rule{Cron: "0 */5 * * * *", Zone: "Europe/Berlin", Start: start, Until: start, Count: 1, CatchUp: All}, ""},
		{"descriptor", Rule{Cron: "@weekly"}, ""},
		{"every under 1s", Rule{Every: 999 * time.Millisecond}, "under the minimum"},
		{"negative every", Rule{Every: -time.Minute}, "under the minimum"},
		{"every not whole ms", Rule{Every: time.Second + time.Microsecond}, "whole number of milliseconds"},
		{"every too long", Rule{Every: 101 * 365 * 24 * time.Hour}, "over the maximum"},
		{"both", Rule{Every: time.Minute, Cron: "@daily"}, "both every and cron"},
		{"neither", Rule{}, "neither every nor cron"},
		{"zone with every", Rule{Every: time.Minute, Zone: "Europe/Berlin"}, "only applies to cron"},
		{"bad zone", Rule{Cron: "@daily", Zone: "Mars/Olympus"}, "unknown time zone"},
		{"Local zone", Rule{Cron: "@daily", Zone: "Local"}, "time zone \"Local\" is refused"},
		{"five fields", Rule{Cron: "*/5 * * * *"}, "6 fields"},
		{"bad field", Rule{Cron: "0 61 * * * *"}, "cron"},
		{"@every in cron", Rule{Cron: "@every 1m"}, "use every"},
		{"TZ in spec", Rule{Cron: "TZ=Europe/Berlin"}, "time zone on its own"},
		{"unknown descriptor", Rule{Cron: "@fortnightly"}, "cron"},
		{"spec too long", Rule{Cron: "0 0 0 1 1 *" + strings.Repeat(" ", 300)}, "limit is 256"},
		{"never fires", Rule{Cron: "0 0 0 30 2 *"}, "never fires"},
		{"until before start", Rule{Every: time.Minute, Start: start, Until: start.Add(-time.Millisecond)}, "before start"},
		{"negative count", Rule{Every: time.Minute, Count: -1}, "negative"},
		{"start out of range", Rule{Every: time.Minute, Start: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)}, "out of range"},
		{"unknown catch-up", Rule{Every: time.Minute, CatchUp: 7}, "unknown catch-up(7)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalid)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if tc.want != "" {
				if _, ok := tc.r.First(start); ok {
					t.Fatal("an invalid rule has a first occurrence")
				}
			}
		})
	}
}

func TestParseCatchUp(t *testing.T) {
	for s, want := range map[string]CatchUp{"one": One, "ALL": All, "All": All} {
		if got, err := ParseCatchUp(s); err != nil || got != want {
			t.Errorf("%q: %v %v", s, got, err)
		}
	}
	if _, err := ParseCatchUp("some"); err == nil {
		t.Error("accepted some")
	}
}

func TestString(t *testing.T) {
	for _, tc := range []struct {
		r    Rule
		want string
	}{
		{Rule{Every: time.Minute}, "every 1m0s"},
		{Rule{Cron: "0 */5 * * * *", Zone: "Europe/Berlin", Until: time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), Count: 10},
			"cron 0 */5 * * * * in Europe/Berlin, until 2026-12-31T00:00:00Z, count 10"},
		{Rule{Cron: "@daily", Start: time.Date(2026, 12, 1, 1, 0, 0, 0, time.FixedZone("X", 3600)), CatchUp: All},
			"cron @daily, start 2026-12-01T00:00:00Z, catch-up all"},
	} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}
