package bridge

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
)

// WakeRelay carries cross-daemon wake-ups: when a daemon stores an envelope
// in a shard another daemon owns, due before that owner would look again,
// it publishes a tiny message on <subject>.internal.wake.<shard> carrying
// the due time; every scanning daemon listens and wakes if it owns the
// shard. Wake-ups are under <subject>.internal, a space only daemons need
// rights on: a publisher who could send them could keep scanners busy.
type WakeRelay struct {
	nc     *nats.Conn
	prefix string
	log    hclog.Logger
}

// InternalSubject is the prefix of daemon-to-daemon subjects.
func InternalSubject(prefix string) string { return prefix + ".internal" }

// NewWakeRelay relays on nc under <subject>.internal.wake.
func NewWakeRelay(nc *nats.Conn, subject string, log hclog.Logger) *WakeRelay {
	return &WakeRelay{nc: nc, prefix: InternalSubject(subject) + ".wake", log: log}
}

// Announce publishes a wake-up for shard. It is best effort: a lost one
// costs at most the owner's idle interval, never an envelope.
func (w *WakeRelay) Announce(shard int, dueMs int64) {
	if err := w.nc.Publish(w.prefix+"."+strconv.Itoa(shard), strconv.AppendInt(nil, dueMs, 10)); err != nil {
		w.log.Debug("wake-up not sent", "shard", shard, "error", err)
	}
}

// Run listens for wake-ups until ctx is done and hands each to local (the
// scanner's WakeLocal, which ignores shards this daemon does not own). The
// receiver is given here, not to NewWakeRelay, because the scanner is built
// with the relay's Announce: each needs the other.
func (w *WakeRelay) Run(ctx context.Context, local func(shard int, dueMs int64)) error {
	sub, err := w.nc.Subscribe(w.prefix+".*", func(m *nats.Msg) {
		shard, err1 := strconv.Atoi(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
		due, err2 := strconv.ParseInt(string(m.Data), 10, 64)
		if err1 != nil || err2 != nil {
			w.log.Debug("malformed wake-up ignored", "subject", m.Subject)
			return
		}
		local(shard, due)
	})
	if err != nil {
		return fmt.Errorf("bridge: wake subscription: %w", err)
	}
	<-ctx.Done()
	return sub.Unsubscribe()
}
