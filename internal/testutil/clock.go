package testutil

import (
	"sync"
	"time"
)

// Clock is a local clock that moves only when the test moves it; its Now
// is what a component's Options.Now takes.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock starts a clock at a fixed time (2023-11-14 22:13:20 UTC).
func NewClock() *Clock { return &Clock{t: time.Unix(1_700_000_000, 0)} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
