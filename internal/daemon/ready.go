package daemon

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/store"
)

// stillUnreachable is when, after the first failure, waitReady says again
// that Redis cannot be reached: a wrong address must not look like a
// daemon that went quiet. After the last, once a minute.
var stillUnreachable = []time.Duration{5 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute}

// waitReady logs "ready" once Redis answers with the scripts loaded and
// the stored format checked (CheckSchema) and NATS is connected (natsDown
// nil), retrying with backoff so an unreachable Redis or NATS at start is
// a logged wait, not a crash: each is said again on the stillUnreachable
// schedule. addrs names the Redis servers tried, for the log. It returns
// CheckSchema's refusal (store.ErrMigrate), which stops the daemon.
func waitReady(ctx context.Context, st *store.Store, addrs []string, natsDown func() error, log hclog.Logger) error {
	// A redis:// address may carry a password: never logged. Each one
	// alone, as a URL parser reads one.
	redacted := make([]string, len(addrs))
	for i, a := range addrs {
		redacted[i] = config.RedactURL(a)
	}
	shown := strings.Join(redacted, ",")
	start := time.Now()
	backoff, nextPing := 50*time.Millisecond, start
	redisUp, failed := false, false
	// The NATS connection logs its own failures as they come (nats.go's
	// errors), and the first proof of the delivery inbox takes a moment on
	// a healthy start: only the reminders are said here, beside Redis'.
	remindRedis, remindNATS := reminder{start: start}, reminder{start: start}
	for {
		if !redisUp && !time.Now().Before(nextPing) {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := st.Ping(pctx)
			cancel()
			if err == nil {
				sctx, cancel := context.WithTimeout(ctx, schemaTimeout)
				err = st.CheckSchema(sctx)
				cancel()
			}
			switch {
			case errors.Is(err, store.ErrMigrate):
				return err
			case ctx.Err() != nil:
				return nil
			case err == nil:
				redisUp = true
				if failed {
					log.Info("Redis reachable", "addrs", shown, "after", time.Since(start).Round(time.Millisecond))
				}
			case !failed:
				log.Warn("Redis not reachable yet, retrying", "addrs", shown, "error", err)
				failed = true
			case remindRedis.due():
				log.Warn("Redis still not reachable: nothing is stored or delivered; check redis.addrs (--redis-addrs, DELAYD_REDIS_ADDRS) and the credentials",
					"addrs", shown, "waited", time.Since(start).Round(time.Second), "error", err)
			}
			nextPing, backoff = time.Now().Add(backoff), min(2*backoff, 5*time.Second)
		}
		natsErr := natsDown()
		if redisUp && natsErr == nil {
			break
		}
		if natsErr != nil && remindNATS.due() {
			log.Warn("NATS still not reachable: nothing is delivered and no request is taken; check nats.url (--nats-url, DELAYD_NATS_URL) and the credentials",
				"waited", time.Since(start).Round(time.Second), "error", natsErr)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
	log.Info("ready")
	return nil
}

// reminder is the schedule of "still not reachable": stillUnreachable
// from start, then once a minute.
type reminder struct {
	start time.Time
	next  int // the reminder due next, in stillUnreachable
}

// due reports whether the next reminder is due, and if so counts it said.
func (r *reminder) due() bool {
	last := len(stillUnreachable) - 1
	at := stillUnreachable[min(r.next, last)] + time.Duration(max(0, r.next-last))*time.Minute
	if time.Since(r.start) < at {
		return false
	}
	r.next++
	return true
}
