package scanner

import (
	"errors"
	"math"
	"time"
)

// ErrNoInterest marks a core NATS delivery the server confirmed reached no
// subscriber (its no-responders status). It did not happen: it is retried
// like any failure, and counts as a try, so Delayd-Attempt keeps going up.
// Its budget is the longer of MaxAttempts and NoInterestRetryFor: a
// consumer that is away (restarting, reconnecting after a NATS restart)
// gets it once it is back.
var ErrNoInterest = errors.New("no subscriber")

// retryDelay is how long an envelope waits after its try-th failed try (1 =
// its first within its budget): RetryBackoff doubled per try up to
// RetryBackoffMax. A max below RetryBackoff keeps every delay at
// RetryBackoff (the constant backoff of versions without the max).
func (o Options) retryDelay(try int) time.Duration {
	d, top := o.RetryBackoff, max(o.RetryBackoffMax, o.RetryBackoff)
	for k := 1; k < try && d < top; k++ {
		if d > top/2 {
			return top
		}
		d *= 2
	}
	return d
}

// noInterestTries is the try at which a delivery that found no subscriber
// goes to the dead set: the first that starts, by the backoff schedule,
// NoInterestRetryFor or more after the first try (the real start is later:
// the schedule leaves out claim and publish times). Never fewer than
// MaxAttempts; with no window, MaxAttempts.
func (o Options) noInterestTries() int {
	window := o.NoInterestRetryFor
	if window <= 0 || o.RetryBackoff <= 0 {
		return o.MaxAttempts
	}
	top := max(o.RetryBackoffMax, o.RetryBackoff)
	k, at := 1, time.Duration(0) // try k starts at `at`
	for at < window {
		d := o.retryDelay(k)
		if d == top {
			// The constant tail: count its tries instead of walking them
			// (a nanosecond backoff over a day would take forever).
			n := (window - at + d - 1) / d
			return max(o.MaxAttempts, k+int(min(int64(n), math.MaxInt64-int64(k))))
		}
		at += d
		k++
	}
	return max(o.MaxAttempts, k)
}
