package daemon

import (
	"context"
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

// waitReady logs "ready" once Redis answers with the scripts loaded and NATS
// is connected, retrying with backoff so an unreachable Redis at start is a
// logged wait, not a crash. addrs names the Redis servers tried, for the
// log.
func waitReady(ctx context.Context, st *store.Store, addrs []string, natsUp func() bool, log hclog.Logger) {
	// A redis:// address may carry a password: never logged. Each one
	// alone, as a URL parser reads one.
	redacted := make([]string, len(addrs))
	for i, a := range addrs {
		redacted[i] = config.RedactURL(a)
	}
	shown := strings.Join(redacted, ",")
	backoff := 50 * time.Millisecond
	start := time.Now()
	next := 0 // the reminder due next, in stillUnreachable
	for failed := false; ; {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := st.Ping(pctx)
		cancel()
		if err == nil {
			if failed {
				log.Info("Redis reachable", "addrs", shown, "after", time.Since(start).Round(time.Millisecond))
			}
			break
		}
		if ctx.Err() != nil {
			return
		}
		waited := time.Since(start)
		switch {
		case !failed:
			log.Warn("Redis not reachable yet, retrying", "addrs", shown, "error", err)
			failed = true
		case waited >= stillUnreachable[min(next, len(stillUnreachable)-1)]+time.Duration(max(0, next-len(stillUnreachable)+1))*time.Minute:
			log.Warn("Redis still not reachable: nothing is stored or delivered; check redis.addrs (--redis-addrs, DELAYD_REDIS_ADDRS) and the credentials",
				"addrs", shown, "waited", waited.Round(time.Second), "error", err)
			next++
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	for !natsUp() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	log.Info("ready")
}
