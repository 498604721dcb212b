// Package ratelog keeps a recurring log line to at most one per interval.
//
// An outage makes the same warning once per claim, request or delivery;
// a Limiter lets the first through, holds back the rest for an interval,
// and tells the next line it lets through how many it stands for. It
// decides only whether to log: the caller keeps its own message and
// fields, so a line reads the same wherever it is limited.
package ratelog

import (
	"sync"
	"time"
)

// Limiter lets a line through at most once per interval. It is safe for
// concurrent use; the zero value is not usable, build one with New.
type Limiter struct {
	every time.Duration
	now   func() time.Time

	mu     sync.Mutex
	last   time.Time // the last line let through; zero: none since Reset
	counts int       // occurrences noted since the last line, the held back ones
}

// New returns a Limiter that lets a line through at most once per every,
// reading the time from now (time.Now if nil; tests inject a clock).
func New(every time.Duration, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{every: every, now: now}
}

// Note records n occurrences of what the line reports (1 for one event, or
// e.g. the envelopes of a claim) and reports whether to log the line now.
// If so, count is what the line stands for: these n and every occurrence
// held back since the last line. The first occurrence after New or Reset
// is always let through.
func (l *Limiter) Note(n int) (ok bool, count int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts += n
	now := l.now()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		return false, 0
	}
	count = l.counts
	l.last, l.counts = now, 0
	return true, count
}

// Reset forgets the last line and what was held back, so the next
// occurrence is logged at once; it reports whether a line was let through
// since New or the previous Reset, so that a "recovered" line follows only
// a failure that was logged.
func (l *Limiter) Reset() (logged bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	logged = !l.last.IsZero()
	l.last, l.counts = time.Time{}, 0
	return logged
}
