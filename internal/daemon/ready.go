package daemon

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/store"
)

// waitReady logs "ready" once Redis answers with the scripts loaded and NATS
// is connected, retrying with backoff so an unreachable Redis at start is a
// logged wait, not a crash.
func waitReady(ctx context.Context, st *store.Store, natsUp func() bool, log hclog.Logger) {
	backoff := 50 * time.Millisecond
	for warned := false; ; {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := st.Ping(pctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		if !warned {
			log.Warn("Redis not reachable yet, retrying", "error", err)
			warned = true
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
