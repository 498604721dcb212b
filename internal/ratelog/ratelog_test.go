package ratelog

import (
	"sync"
	"testing"
	"time"
)

// clock is a hand-moved clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                   { return &clock{t: time.Unix(1_700_000_000, 0)} }
func note(t *testing.T, l *Limiter, n int, wantOK bool, wantCount int) {
	t.Helper()
	if ok, count := l.Note(n); ok != wantOK || count != wantCount {
		t.Fatalf("Note(%d) = %v, %d; want %v, %d", n, ok, count, wantOK, wantCount)
	}
}

func TestFirstLineAtOnceThenOnePerInterval(t *testing.T) {
	c := newClock()
	l := New(5*time.Second, c.now)
	note(t, l, 1, true, 1) // the first occurrence is logged
	note(t, l, 1, false, 0)
	c.advance(4999 * time.Millisecond)
	note(t, l, 1, false, 0)
	c.advance(time.Millisecond) // exactly one interval after the line
	note(t, l, 1, true, 3)      // stands for itself and the two held back
	note(t, l, 1, false, 0)
	c.advance(time.Hour)
	note(t, l, 1, true, 2)
}

func TestCountsWhatTheCallerNotes(t *testing.T) {
	c := newClock()
	l := New(time.Second, c.now)
	note(t, l, 7, true, 7) // e.g. the envelopes of a claim
	note(t, l, 3, false, 0)
	note(t, l, 2, false, 0)
	c.advance(time.Second)
	note(t, l, 1, true, 6)
}

func TestResetLogsTheNextAtOnceAndSaysIfALineWent(t *testing.T) {
	c := newClock()
	l := New(5*time.Second, c.now)
	if l.Reset() {
		t.Fatal("Reset before any line: logged = true")
	}
	note(t, l, 1, true, 1)
	note(t, l, 1, false, 0)
	if !l.Reset() {
		t.Fatal("Reset after a line: logged = false")
	}
	if l.Reset() {
		t.Fatal("second Reset: logged = true")
	}
	note(t, l, 1, true, 1) // at once, within the interval, the held back one forgotten
}

func TestNilClockIsTimeNow(t *testing.T) {
	l := New(time.Hour, nil)
	note(t, l, 1, true, 1)
	note(t, l, 1, false, 0)
}

// TestConcurrentNotesLetOneLineThrough: publish workers share a Limiter;
// run with -race.
func TestConcurrentNotesLetOneLineThrough(t *testing.T) {
	var mu sync.Mutex
	c := newClock()
	l := New(time.Minute, func() time.Time { mu.Lock(); defer mu.Unlock(); return c.now() })
	var wg sync.WaitGroup
	var lines, counted int
	var res sync.Mutex
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if ok, n := l.Note(1); ok {
					res.Lock()
					lines, counted = lines+1, counted+n
					res.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if lines != 1 || counted != 1 {
		t.Fatalf("lines, counted = %d, %d; want 1, 1", lines, counted)
	}
	mu.Lock()
	c.advance(time.Minute)
	mu.Unlock()
	note(t, l, 1, true, 800) // the 799 held back and this one
}
