package daemon

import (
	"time"

	"github.com/delayd/delayd/internal/store"
)

// defaultVersion is the version a daemon reports without WithVersion, the
// one of an unreleased build.
const defaultVersion = "0.2.0-dev"

// Option changes what New builds.
type Option func(*options)

type options struct {
	version string
	now     func() time.Time // the local wall clock (nil: time.Now); Redis time decides due times
	store   []store.Option
	acked   func(ids []string) // scanner.Options.Acked
}

// WithVersion is the version the daemon reports: in its log, as the
// version of its NATS micro service (semantic versioning) and in
// delayd_build_info.
func WithVersion(v string) Option {
	return func(o *options) { o.version = v }
}

// WithNewestFormat makes the daemon read (and, once the fleet agrees,
// write) a simulated next stored format, as the next version would. For
// tests.
func WithNewestFormat(f int) Option {
	return func(o *options) { o.store = append(o.store, store.WithNewestFormat(f)) }
}

// WithClock replaces the wall clock of the daemon's intakes, to prove that
// a skewed local clock cannot make anything fire early. For tests.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// WithAcked tells acked the ids of each batch of settles the scanner's
// store wrote (scanner.Options.Acked), so a test waits for an ack nothing
// outside the daemon shows instead of sleeping. For tests.
func WithAcked(acked func(ids []string)) Option {
	return func(o *options) { o.acked = acked }
}
