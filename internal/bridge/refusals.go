package bridge

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// Refusals records, in order, every asynchronous error the server reports
// on one connection, and for permission violations the subject refused.
// The server drops a refused publish and says so with an -ERR; nats.go
// keeps only the last error as the connection's and hands each to the
// async error handler. A flush does not fail for them, so without this
// record a batch with several refused targets would count all but the
// last as delivered.
type Refusals struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every record
	seq     uint64
	recent  []refusal // the last refusalsKept, oldest first
}

type refusal struct {
	seq     uint64
	err     error
	publish bool   // a refused publish
	subject string // its subject, "" if unreadable
}

// refusalsKept bounds the record. A batch whose errors overflow it is not
// attributed (every core delivery of it is retried), see since.
const refusalsKept = 4096

// NewRefusals returns an empty record.
func NewRefusals() *Refusals { return &Refusals{changed: make(chan struct{})} }

// record is the connection's async error handler's part.
func (r *Refusals) record(err error) {
	if r == nil || err == nil {
		return
	}
	f := refusal{err: err}
	if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), "Publish to ") {
		f.publish = true
		f.subject, _ = refusedSubject(err.Error())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	f.seq = r.seq
	r.recent = append(r.recent, f)
	if len(r.recent) > refusalsKept {
		r.recent = append(r.recent[:0], r.recent[len(r.recent)-refusalsKept:]...)
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// refusedSubject reads the subject of a refused publish from the server's
// message, which quotes it Go-style (%q): a subject with '"', '\' or bytes
// that are not UTF-8 arrives escaped.
func refusedSubject(msg string) (string, bool) {
	_, rest, ok := strings.Cut(msg, "Publish to ")
	if !ok {
		return "", false // a refused subscription: not a delivery
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", false
	}
	s, err := strconv.Unquote(q)
	return s, err == nil
}

// Mark is the position to collect refusals from.
func (r *Refusals) Mark() uint64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// Since waits until last (the connection's last error, which the async
// handler receives as the same value, after every earlier one) has been
// recorded after mark, or ctx ends; with a nil last it does not wait. It returns every publish refusal after
// Mark by subject, and whether that record is complete: false when ctx
// ended first, when the record overflowed, or when a permission violation
// could not be read.
func (r *Refusals) Since(ctx context.Context, mark uint64, last error) (map[string]error, bool) {
	if r == nil {
		return nil, false
	}
	for {
		r.mu.Lock()
		seen, complete := false, len(r.recent) == 0 || r.recent[0].seq <= mark+1
		out := map[string]error{}
		for _, f := range r.recent {
			if f.seq <= mark {
				continue
			}
			switch {
			case f.subject != "":
				out[f.subject] = f.err
			case f.publish:
				complete = false // a refused publish whose subject is unreadable
			}
			if f.err == last {
				seen = true
			}
		}
		wait := r.changed
		r.mu.Unlock()
		if seen || last == nil {
			return out, complete
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return out, false
		}
	}
}

// RefusedSince returns a channel closed at the next record, and the first
// refusal of a publish to subject recorded after mark, if any.
func (r *Refusals) RefusedSince(mark uint64, subject string) (<-chan struct{}, error) {
	if r == nil {
		return nil, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.recent {
		if f.seq > mark && f.subject == subject {
			return r.changed, f.err
		}
	}
	return r.changed, nil
}

// After returns every error recorded after mark that the record still
// keeps.
func (r *Refusals) After(mark uint64) []error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []error
	for _, f := range r.recent {
		if f.seq > mark {
			out = append(out, f.err)
		}
	}
	return out
}
