package flow

import (
	"context"
	"fmt"
	"time"

	"github.com/delayd/delayd/internal/store"
)

// ControlStore is the part of the store the operator's changes write.
type ControlStore interface {
	FlowRules(ctx context.Context) (store.FlowRules, error)
	Held(ctx context.Context, patterns []string) (map[string]store.FlowHeld, error)
	SetLimit(ctx context.Context, l store.Limit) error
	RemoveLimit(ctx context.Context, pattern string) (bool, int, error)
	Pause(ctx context.Context, pattern string) (int64, error)
	Resume(ctx context.Context, pattern string) (bool, int, error)
}

// Control makes the operator's changes: the CLI's (through the operator
// subjects), the console's and the config file's. Each is written to
// Redis, read back by this daemon's Gate at once, and answered after
// twice PollInterval, when every live daemon holds it: a pause answered
// is a pause in force fleet-wide.
type Control struct {
	st   ControlStore
	gate *Gate // nil in a daemon that does not deliver
	// settle is how long a change waits before it is answered.
	settle time.Duration
	// wake makes every shard's owner claim now: released envelopes are
	// due now, not at the next idle tick.
	wake func()
}

// NewControl returns the operator's controls; gate may be nil, and so may
// wake (which makes every shard's owner claim now).
func NewControl(st ControlStore, gate *Gate, wake func()) *Control {
	if wake == nil {
		wake = func() {}
	}
	return &Control{st: st, gate: gate, settle: 2 * PollInterval, wake: wake}
}

// MaxBurst bounds a limit's burst.
const MaxBurst = 1_000_000

// SetLimit limits the deliveries to targets matching pattern to rate
// ("500/s"), after a burst of burst (0: 1).
func (c *Control) SetLimit(ctx context.Context, pattern, rate string, burst int) (Status, error) {
	if err := CheckPattern(pattern); err != nil {
		return Status{}, err
	}
	interval, err := ParseRate(rate)
	if err != nil {
		return Status{}, err
	}
	if burst == 0 {
		burst = 1
	}
	if burst < 1 || burst > MaxBurst {
		return Status{}, fmt.Errorf("%w: burst %d: want 1..%d", ErrBadRule, burst, MaxBurst)
	}
	if err := c.st.SetLimit(ctx, store.Limit{Pattern: pattern, Rate: rate, IntervalUs: interval, Burst: burst}); err != nil {
		return Status{}, err
	}
	return c.changed(ctx, pattern)
}

// RemoveLimit removes the limit on pattern; what it held is due now.
func (c *Control) RemoveLimit(ctx context.Context, pattern string) (existed bool, released int, err error) {
	return c.release(ctx, pattern, c.st.RemoveLimit)
}

// Pause holds every delivery to targets matching pattern until Resume.
func (c *Control) Pause(ctx context.Context, pattern string) (Status, error) {
	if err := CheckPattern(pattern); err != nil {
		return Status{}, err
	}
	if _, err := c.st.Pause(ctx, pattern); err != nil {
		return Status{}, err
	}
	return c.changed(ctx, pattern)
}

// Resume ends the pause of pattern: what it parked goes out in due order,
// under any limit, with the attempts it had.
func (c *Control) Resume(ctx context.Context, pattern string) (existed bool, released int, err error) {
	return c.release(ctx, pattern, c.st.Resume)
}

// release removes pattern's rule with remove, which releases what the rule
// held, and wakes every shard's owner: once at once (this daemon's Gate
// reads the change first; a daemon that has not, parks again what it
// claims, which its next reading releases), and again once every daemon
// holds the change.
func (c *Control) release(ctx context.Context, pattern string,
	remove func(context.Context, string) (bool, int, error)) (existed bool, released int, err error) {
	if err := CheckPattern(pattern); err != nil {
		return false, 0, err
	}
	existed, released, err = remove(ctx, pattern)
	if err == nil && c.gate != nil {
		err = c.gate.Refresh(ctx)
	}
	if released > 0 {
		c.wake()
	}
	if err == nil {
		_, err = c.changed(ctx, pattern)
	}
	if released > 0 {
		c.wake()
	}
	return existed, released, err
}

// changed makes this daemon's Gate read the rules now, waits until every
// live daemon's has, and returns pattern's status.
func (c *Control) changed(ctx context.Context, pattern string) (Status, error) {
	if c.gate != nil {
		if err := c.gate.Refresh(ctx); err != nil {
			return Status{}, err
		}
	}
	select {
	case <-ctx.Done():
		return Status{}, ctx.Err()
	case <-time.After(c.settle):
	}
	all, err := c.Statuses(ctx)
	if err != nil {
		return Status{}, err
	}
	for _, s := range all {
		if s.Pattern == pattern {
			return s, nil
		}
	}
	return Status{Pattern: pattern}, nil
}

// Statuses reads every rule, and what it holds, from Redis.
func (c *Control) Statuses(ctx context.Context) ([]Status, error) {
	r, err := c.st.FlowRules(ctx)
	if err != nil {
		return nil, err
	}
	var ps []string
	for _, l := range r.Limits {
		ps = append(ps, l.Pattern)
	}
	for p := range r.Paused {
		ps = append(ps, p)
	}
	held, err := c.st.Held(ctx, ps)
	if err != nil {
		return nil, err
	}
	return Statuses(r, held), nil
}
