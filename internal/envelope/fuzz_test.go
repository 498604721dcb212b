package envelope

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/recur"
)

// FuzzParseSchedule feeds arbitrary header sets to the header decoder: it
// must never panic, and whatever it accepts must satisfy every limit and
// the target policy.
func FuzzParseSchedule(f *testing.F) {
	f.Add("Delayd-Target", "orders.cancel", "Delayd-Delay", "30m", "traceparent", "00-ab-cd-01", []byte("payload"))
	f.Add("Delayd-Target", "$SYS.x", "Delayd-At", "2026-11-30T10:00:00.250Z", "Delayd-Id", "\x00", []byte{})
	f.Add("delayd-target", "a..b", "DELAYD-DELAY", "-1s", "Delayd-Id", strings.Repeat("x", 300), []byte{0xff})
	f.Add("Delayd-Target", "a.*", "Delayd-Delay", "1h1m1s1ms1us1ns", "Delayd-At", "now", []byte("x"))
	f.Add("Delayd-Target", "a.b", "Delayd-Every", "1m", "Delayd-Count", "3", []byte("x"))
	f.Add("Delayd-Target", "a.b", "Delayd-Cron", "0 30 2 * * *", "Delayd-Time-Zone", "Australia/Sydney", []byte{})
	f.Add("Nats-Schedule-Target", "a.b", "Nats-Schedule", "@every 1s", "Nats-Schedule-Time-Zone", "Europe/Berlin", []byte{})
	f.Add("Delayd-Target", "a.b", "Nats-Schedule", "@at 2026-11-30T10:00:30Z", "Nats-Schedule-Source", "x", []byte{})
	f.Add("Delayd-Target", "a.b", "nats-schedule", "@hourly", "Delayd-Until", "2026-11-30T10:30:00Z", []byte{})
	lim := Limits{MaxPayload: 64, MaxIDLen: 32, MaxHeaders: 8, MaxHeaderBytes: 256, MaxDelay: time.Hour, MaxPast: time.Minute}
	pol := Policy{Prefix: "delayd"}
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string, payload []byte) {
		h := map[string][]string{}
		for _, kv := range [][2]string{{k1, v1}, {k2, v2}, {k3, v3}} {
			h[kv[0]] = append(h[kv[0]], kv[1])
		}
		r, err := ParseSchedule(h, payload, lim, pol, now)
		if err != nil {
			if c := CodeOf(err); c != CodeBadRequest && c != CodeForbidden && c != CodeTooLarge {
				t.Fatalf("unexpected code %d: %v", c, err)
			}
			return
		}
		if !ValidTarget(r.Target) || !pol.Allowed(r.Target) || len(r.Payload) > lim.MaxPayload || len(r.ID) > lim.MaxIDLen {
			t.Fatalf("accepted an envelope outside the limits: %+v", r)
		}
		if !r.HasAt && (r.Delay < 0 || r.Delay > lim.MaxDelay) {
			t.Fatalf("accepted delay %s", r.Delay)
		}
		if r.Series != nil {
			at := r.At
			if !r.HasAt {
				at = now.Add(r.Delay) // Every without Start
			}
			if err := r.Series.Validate(); err != nil || at.Sub(now) > lim.MaxDelay || at.Before(now) {
				t.Fatalf("accepted series %s first due %v: %v", r.Series, r.At, err)
			}
		}
		for k := range r.Header {
			if HasPrefixFold(k, controlPrefix) || HasPrefixFold(k, natsSchedulePrefix) {
				t.Fatalf("control header %q passed through", k)
			}
		}
	})
}

// FuzzCodec: any envelope round-trips, and any byte string either decodes
// or is rejected without a panic.
func FuzzCodec(f *testing.F) {
	f.Add("orders.cancel", "traceparent", "v", []byte("payload"), int64(0), "")
	f.Add("", "", "", []byte{}, int64(60), "")
	f.Add("a", "k", "\x00\xff", []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff}, int64(0), "0 30 2 * * *")
	f.Add("a", "k", "v", []byte{2, 1, 'a', 0, 5, 1, 0, 0xe8, 7, 0}, int64(3600), "@daily")
	f.Fuzz(func(t *testing.T, target, key, val string, payload []byte, everySec int64, cron string) {
		e := Envelope{Target: target, Payload: payload}
		if key != "" && key != headerStored { // reserved: refused at intake, taken out by Decode
			e.Header = map[string][]string{key: {val}}
		}
		if r := (recur.Rule{Every: time.Duration(everySec) * time.Second, Cron: cron}); r.Validate() == nil {
			e.Series = &r
		}
		got, err := Decode(Encode(e))
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if got.Target != e.Target || !bytes.Equal(got.Payload, e.Payload) || !reflect.DeepEqual(got.Header, e.Header) ||
			!reflect.DeepEqual(got.Series, e.Series) {
			t.Fatalf("round trip changed %+v into %+v", e, got)
		}
		// Arbitrary bytes: decode or reject, never panic.
		_, _ = Decode(append([]byte{formatV1, 0, 0, 0, 0, 0, 0, 0, 0}, payload...))
		_, _ = Decode(append([]byte{formatV2}, payload...))
		_, _ = Decode(payload)
	})
}

// FuzzSubject: the validator and matcher agree with each other and never
// panic; a valid literal target matches itself and ">".
func FuzzSubject(f *testing.F) {
	for _, s := range []string{"orders.cancel", "a.*.b", ">", "a..b", "$SYS.>", " ", "a.>.b", "_INBOX.x"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, pattern, subject string) {
		m := Match(pattern, subject)
		if ValidTarget(subject) {
			if !Match(subject, subject) || !Match(">", subject) {
				t.Fatalf("valid subject %q does not match itself or >", subject)
			}
		}
		if m && ValidTarget(pattern) && pattern != subject {
			t.Fatalf("literal pattern %q matched a different subject %q", pattern, subject)
		}
		_ = ValidPattern(pattern)
	})
}
