package bridge

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// Refusals records, in order, every permissions violation the server
// reports on one connection. The server drops a refused publish and says
// so with an -ERR; nats.go keeps only the last as the connection's error
// and hands each to the async error handler. A flush does not fail for
// them, so without this record a batch with several refused targets would
// count all but the last as delivered.
type Refusals struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every record
	seq     uint64
	recent  []refusal // the last refusalsKept, oldest first
}

type refusal struct {
	seq     uint64
	err     error
	subject string
}

// refusalsKept bounds the record; a publish batch only looks at its own.
const refusalsKept = 4096

// NewRefusals returns an empty record.
func NewRefusals() *Refusals { return &Refusals{changed: make(chan struct{})} }

// record is the connection's async error handler's part.
func (r *Refusals) record(err error) {
	if r == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	_, subj, ok := strings.Cut(err.Error(), `Publish to "`)
	if !ok {
		return // a refused subscription: not a delivery
	}
	subj, _, _ = strings.Cut(subj, `"`)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.recent = append(r.recent, refusal{seq: r.seq, err: err, subject: subj})
	if len(r.recent) > refusalsKept {
		r.recent = append(r.recent[:0], r.recent[len(r.recent)-refusalsKept:]...)
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// mark is the position to collect refusals from.
func (r *Refusals) mark() uint64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// since waits until the refusal last (the connection's last error, which
// the async handler receives as the same value) has been recorded, or ctx
// ends, and returns every publish refusal after mark by subject.
func (r *Refusals) since(ctx context.Context, mark uint64, last error) (map[string]error, bool) {
	if r == nil {
		return nil, false
	}
	for {
		r.mu.Lock()
		seen := false
		out := map[string]error{}
		for _, f := range r.recent {
			if f.seq > mark {
				out[f.subject] = f.err
			}
			if f.err == last {
				seen = true
			}
		}
		wait := r.changed
		r.mu.Unlock()
		if seen || last == nil {
			return out, true
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return out, false
		}
	}
}
