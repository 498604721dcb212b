package client

import (
	"context"
	"errors"
	"math/rand"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// The request headers of a schedule (see docs/protocol.md).
const (
	headerTarget   = "Delayd-Target"
	headerAt       = "Delayd-At"
	headerDelay    = "Delayd-Delay"
	headerID       = "Delayd-Id"
	headerJitter   = "Delayd-Jitter"
	headerEvery    = "Delayd-Every"
	headerCron     = "Delayd-Cron"
	headerTimeZone = "Delayd-Time-Zone"
	headerStart    = "Delayd-Start"
	headerUntil    = "Delayd-Until"
	headerCount    = "Delayd-Count"
	headerCatchUp  = "Delayd-Catch-Up"
)

// Scheduled is the answer to a schedule: the envelope is stored.
type Scheduled struct {
	ID string `json:"id"`
	// DeliverAt is the due time (of the first delivery, for a repeat), in
	// milliseconds, by the daemon's Redis clock.
	DeliverAt time.Time `json:"deliver_at"`
}

// ScheduleOption says when to deliver, and what else to send. Exactly one
// of At, Delay, Every and Cron is required.
type ScheduleOption func(*schedule)

// schedule is a request being built; the first mistake is kept in err.
type schedule struct {
	h     nats.Header
	when  []string // the names of At, Delay, Every, Cron given
	start time.Time
	until time.Time
	err   error
}

func (s *schedule) fail(format string, args ...any) {
	if s.err == nil {
		s.err = badRequest("schedule", format, args...)
	}
}

// At delivers at t. A t in the past is due at once (within the daemon's
// limits.max_past).
func At(t time.Time) ScheduleOption {
	return func(s *schedule) {
		s.when = append(s.when, "At")
		s.h.Set(headerAt, t.UTC().Format(time.RFC3339Nano))
	}
}

// Delay delivers d after the daemon stores the envelope.
func Delay(d time.Duration) ScheduleOption {
	return func(s *schedule) {
		s.when = append(s.when, "Delay")
		if d < 0 {
			s.fail("negative Delay %s", d)
		}
		s.h.Set(headerDelay, d.String())
	}
}

// Jitter delivers at a moment in [due, due + d), never before the due
// time, so that envelopes due at one instant are spread over d; for a
// repeat each occurrence gets its own moment. The moment follows from the
// ID, so a resend gets the same one. d is whole ms, at most the daemon's
// limits.max_jitter (default 1h).
func Jitter(d time.Duration) ScheduleOption {
	return func(s *schedule) {
		if d < time.Millisecond {
			s.fail("Jitter must be at least 1ms, got %s", d)
		}
		s.h.Set(headerJitter, d.String())
	}
}

// Every delivers repeatedly, every d.
func Every(d time.Duration) ScheduleOption {
	return func(s *schedule) {
		s.when = append(s.when, "Every")
		if d <= 0 {
			s.fail("Every wants a positive interval, got %s", d)
		}
		s.h.Set(headerEvery, d.String())
	}
}

// Cron delivers repeatedly, at the times of a cron spec, in the TimeZone
// (UTC unless given).
func Cron(spec string) ScheduleOption {
	return func(s *schedule) {
		s.when = append(s.when, "Cron")
		if strings.TrimSpace(spec) == "" {
			s.fail("empty Cron spec")
		}
		s.h.Set(headerCron, spec)
	}
}

// TimeZone is the IANA zone a Cron spec is read in, e.g. "Europe/Paris".
func TimeZone(name string) ScheduleOption {
	return func(s *schedule) {
		if name == "" {
			s.fail("empty TimeZone")
		}
		s.h.Set(headerTimeZone, name)
	}
}

// Start is when a repeat begins (default: at once).
func Start(t time.Time) ScheduleOption {
	return func(s *schedule) {
		s.start = t
		s.h.Set(headerStart, t.UTC().Format(time.RFC3339Nano))
	}
}

// Until is when a repeat ends: no delivery is due after t.
func Until(t time.Time) ScheduleOption {
	return func(s *schedule) {
		s.until = t
		s.h.Set(headerUntil, t.UTC().Format(time.RFC3339Nano))
	}
}

// Count ends a repeat after n deliveries.
func Count(n int) ScheduleOption {
	return func(s *schedule) {
		if n < 1 {
			s.fail("Count must be at least 1, got %d", n)
		}
		s.h.Set(headerCount, strconv.Itoa(n))
	}
}

// CatchUpAll makes a repeat that fell behind (every delayd was down)
// deliver every missed time. By default ("one") one late occurrence is
// delivered for all of them and the series goes on from now.
func CatchUpAll() ScheduleOption {
	return func(s *schedule) { s.h.Set(headerCatchUp, "all") }
}

// ID names the envelope: the same id again replaces it (payload, headers
// and time), never duplicates it. Without it the daemon makes one.
func ID(id string) ScheduleOption {
	return func(s *schedule) {
		if id == "" {
			s.fail("empty ID")
		}
		s.h.Set(headerID, id)
	}
}

// Header adds a header that travels with the payload to the target
// (repeatable; values of one key add up). Delayd-* names are the options'.
func Header(key, value string) ScheduleOption {
	return func(s *schedule) {
		if len(key) >= len("Delayd-") && strings.EqualFold(key[:len("Delayd-")], "Delayd-") {
			s.fail("header %s is a control header: use the option for it", key)
		}
		s.h.Add(key, value)
	}
}

// build turns the options into a message, or the first mistake in them.
func build(target string, payload []byte, opts []ScheduleOption) (*nats.Msg, error) {
	s := &schedule{h: nats.Header{}}
	if target == "" {
		s.fail("empty target")
	}
	s.h.Set(headerTarget, target)
	for _, o := range opts {
		o(s)
	}
	repeat := s.h.Get(headerEvery) != "" || s.h.Get(headerCron) != ""
	switch {
	case len(s.when) != 1:
		s.fail("exactly one of At, Delay, Every and Cron is required, got %d %v", len(s.when), s.when)
	case s.h.Get(headerTimeZone) != "" && s.h.Get(headerCron) == "":
		s.fail("TimeZone is for Cron")
	case !repeat && (s.h.Get(headerStart) != "" || s.h.Get(headerUntil) != "" || s.h.Get(headerCount) != "" || s.h.Get(headerCatchUp) != ""):
		s.fail("Start, Until, Count and CatchUpAll are for Every and Cron")
	case !s.start.IsZero() && !s.until.IsZero() && s.until.Before(s.start):
		s.fail("Until %s is before Start %s", s.until.Format(time.RFC3339Nano), s.start.Format(time.RFC3339Nano))
	}
	if s.err != nil {
		return nil, s.err
	}
	return &nats.Msg{Header: s.h, Data: payload}, nil
}

// Schedule stores payload for delivery to target, when the options say,
// and returns once the daemon has stored it.
//
// An error matches one of the sentinels: ErrBadRequest (also for options
// checked before sending: nothing is sent), ErrForbidden, ErrTooLarge,
// ErrUnavailable (nothing stored, or no delayd answers) or
// ErrOutcomeUnknown. The last comes with a 504 (Redis timed out after the
// write was sent; the *ServiceError carries the id) or when ctx ends
// before a reply: the request may have been stored, so retry with the
// same ID, which replaces rather than duplicates. ScheduleRetrying does
// that.
func (c *Client) Schedule(ctx context.Context, target string, payload []byte, opts ...ScheduleOption) (Scheduled, error) {
	m, err := build(target, payload, opts)
	if err != nil {
		return Scheduled{}, err
	}
	return c.schedule(ctx, m.Header.Get(headerID), m)
}

// schedule sends one schedule request, in a batch with the Batching
// option.
func (c *Client) schedule(ctx context.Context, id string, m *nats.Msg) (Scheduled, error) {
	if c.batch != nil {
		return c.batch.schedule(ctx, id, m)
	}
	var out Scheduled
	err := c.request(ctx, "schedule", id, m, &out)
	return out, err
}

// retryRoom is the least time before ctx's deadline in which
// ScheduleRetrying starts a retry.
const retryRoom = 50 * time.Millisecond

// ScheduleRetrying is Schedule that retries until the envelope is stored,
// a retry cannot help (400, 403, 413), or ctx ends. It retries on
// ErrUnavailable and ErrOutcomeUnknown, with backoff, each attempt
// bounded by the RetryTimeout option. Without an ID option it makes one
// (a NUID) before the first attempt and sends the same on every retry:
// that makes the retries safe, since a second store under the same id
// replaces the first, it never adds a duplicate delivery. The returned
// error, when ctx ended, is the last attempt's. No retry starts so close
// to ctx's deadline that the deadline would cut it short (less than four
// times the slowest answer so far, and at least 50 ms): such an attempt
// could only end as ErrOutcomeUnknown, although every answer said
// ErrUnavailable; the call returns the last answer instead.
func (c *Client) ScheduleRetrying(ctx context.Context, target string, payload []byte, opts ...ScheduleOption) (Scheduled, error) {
	m, err := build(target, payload, opts)
	if err != nil {
		return Scheduled{}, err
	}
	id := m.Header.Get(headerID)
	if id == "" {
		id = newID()
		m.Header.Set(headerID, id)
	}
	backoff := 50 * time.Millisecond
	// unknown is the last attempt whose outcome is unknown: once one may
	// have stored the envelope, a later attempt that wrote nothing does
	// not make "nothing stored" true.
	var unknown error
	// answered is the longest an attempt took to get an answer (a reply,
	// or the server's no-responders status); 0 before the first answer.
	var answered time.Duration
	var last error
	for {
		if dl, ok := ctx.Deadline(); ok && answered > 0 && time.Until(dl) < max(retryRoom, 4*answered) {
			if unknown != nil {
				return Scheduled{}, unknown
			}
			return Scheduled{}, last
		}
		actx, cancel := context.WithTimeout(ctx, c.retryTimeout)
		// A fresh message per attempt: the request sets its reply subject.
		start := time.Now()
		out, err := c.schedule(actx, id, &nats.Msg{Header: m.Header, Data: m.Data})
		if actx.Err() == nil {
			answered = max(answered, time.Since(start))
		}
		cancel()
		last = err
		if errors.Is(err, ErrOutcomeUnknown) {
			unknown = err
		}
		// A closed connection never sends again: retrying would only wait
		// for ctx.
		retryable := errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown)
		if err == nil || !retryable || ctx.Err() != nil || c.nc.IsClosed() {
			if retryable && unknown != nil {
				return out, unknown
			}
			return out, err
		}
		// Full jitter, so clients that failed together do not retry together.
		wait := time.Duration(rand.Int63n(int64(backoff)) + 1)
		backoff = min(2*backoff, 5*time.Second)
		select {
		case <-ctx.Done():
			if unknown != nil {
				return out, unknown
			}
			return out, err
		case <-time.After(wait):
		}
	}
}
