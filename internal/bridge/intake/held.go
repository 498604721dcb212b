package intake

import (
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/ratelog"
)

// heldBytes bounds the bytes of schedule requests taken but not yet
// answered: a handler waits while the bound is reached, so a burst of large
// payloads waits in the NATS client's pending buffer (bounded too, by the
// endpoint's pending limits) instead of piling up in the batches. One
// request larger than the bound still passes when nothing else is held.
//
// It is a budget that must return to zero once the work is done (the
// delayd_..._held_bytes gauges read bytes): bytes never given back shrink
// the bound until every handler waits for good. A wait is logged, at most
// once per pauseLogEvery, so such a stall shows in the log too.
type heldBytes struct {
	bounded  bool   // limit > 0 at construction; never changes
	what     string // the intake, for the log: "request intake"
	key      string // the bound's config key, for the log
	log      hclog.Logger
	pauseLog *ratelog.Limiter
	mu       sync.Mutex
	cond     *sync.Cond
	limit    int64
	held     int64 // counted when unbounded too, for the gauge
	waiters  int
}

// pauseLogEvery is the least time between two lines saying an intake
// waits for its held bytes.
const pauseLogEvery = 5 * time.Second

func newHeldBytes(limit int64, what, key string, log hclog.Logger, now func() time.Time) *heldBytes {
	h := &heldBytes{bounded: limit > 0, limit: limit, what: what, key: key, log: log, pauseLog: ratelog.New(pauseLogEvery, now)}
	h.cond = sync.NewCond(&h.mu)
	return h
}

// setLimit changes the bound (when it is raised to fit one message).
func (h *heldBytes) setLimit(limit int64) {
	if !h.bounded || limit <= 0 {
		return
	}
	h.mu.Lock()
	h.limit = limit
	h.mu.Unlock()
	h.cond.Broadcast()
}

func (h *heldBytes) acquire(n int64) {
	h.mu.Lock()
	logged := false
	for h.bounded && h.held > 0 && h.held+n > h.limit {
		if !logged {
			// Logged outside the lock, then the bound looked at again.
			logged = true
			held, limit := h.held, h.limit
			h.mu.Unlock()
			if ok, count := h.pauseLog.Note(1); ok {
				h.log.Info(h.what+" paused: the bytes it holds are at their bound, "+h.key,
					"held", held, "bound", limit, "waits", count)
			}
			h.mu.Lock()
			continue
		}
		h.waiters++
		h.cond.Wait()
		h.waiters--
	}
	h.held += n
	h.mu.Unlock()
}

func (h *heldBytes) release(n int64) {
	if n == 0 {
		return
	}
	h.mu.Lock()
	h.held -= n
	h.mu.Unlock()
	if h.bounded {
		h.cond.Broadcast()
	}
}

// bytes is how many bytes are held now.
func (h *heldBytes) bytes() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

// waiting is how many acquires wait for bytes to be released.
func (h *heldBytes) waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waiters
}

// requestBytes is what a schedule request holds: its payload and headers.
func requestBytes(data []byte, h map[string][]string) int64 {
	n := len(data)
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return int64(n)
}

// sendGate lets handlers send to a queue that Run closes: a handler sends
// only while the gate is open, and closing waits for the sends under way
// (a handler waiting for held bytes, or for room in the queue, gets it
// from the flushers, which keep running), so nothing is ever sent on the
// closed channel, however long Redis takes.
type sendGate struct {
	mu     sync.RWMutex
	closed bool
}

// enter reports whether the gate is open; if it is, the caller sends and
// then calls leave.
func (g *sendGate) enter() bool {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return false
	}
	return true
}

func (g *sendGate) leave() { g.mu.RUnlock() }

// close closes the gate once no send is under way, then runs f (closing
// the queue).
func (g *sendGate) close(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		f()
	}
}

// largestMessage is the most bytes one valid message to delayd can take on
// the wire: the NATS server's max_payload (or limits.max_payload, if
// larger), the headers and framing. A byte bound below it would drop or
// stall on that message every time. Not connected yet, it assumes NATS'
// own ceiling for max_payload (64 MiB).
func largestMessage(nc *nats.Conn, lim envelope.Limits) int64 {
	largest := max(int64(lim.MaxPayload), nc.MaxPayload())
	if largest <= 0 {
		largest = 64 << 20
	}
	return largest + int64(lim.MaxHeaderBytes) + 4<<10
}
