package bridge

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/scanner"
)

// interest finds the core deliveries of a batch that reached no
// subscriber. Each is published with a reply subject on delayd's inbox,
// <inbox>.<batch>.<index>; when no subscription matches it, the server
// answers on that subject with a no-responders status (an empty message
// with "Status: 503"), because the connection announces headers and
// no_responders (nats.go does by default) and subscribes to the reply.
// The server writes that status before the PONG of the flush that follows
// the batch, and nats.go's read loop hands it to the subscription's channel
// before it reads the PONG, so once the flush returns, every status of
// the batch is in the channel, counted by the subscription's Delivered.
//
// A goroutine takes the messages off the channel as they come, so that
// replies from subscribers (unnecessary, but harmless) cannot fill it
// between batches; a batch waits until it has taken as many as were
// delivered when its flush returned. Anything but a no-responders status
// on the current batch is dropped, so a late status of an earlier batch
// whose flush failed, or a subscriber's reply, changes nothing.
type interest struct {
	sub  *nats.Subscription
	ch   chan *nats.Msg
	base string // "<inbox>."
	done chan struct{}

	// The reply subjects of the batch being sent; under the publisher's
	// send lock.
	buf     []byte
	replies string
	ends    []int

	mu    sync.Mutex
	batch uint64 // the batch being sent; 0 between batches
	hit   []bool // hit[i]: the batch's delivery i reached no subscriber
	taken int64  // messages taken off ch
	// woken is closed once taken reaches until: a batch waits for it. nil
	// while no batch waits, so the messages between batches (replies,
	// PubAcks of a stream that captures a core target) cost no wake-up.
	woken chan struct{}
	until int64
}

// statusBuffer is the channel between nats.go's read loop and the
// goroutine taking statuses off it. A status that finds it full is dropped
// by nats.go (slow consumer); Publish notices and fails the deliveries it
// cannot vouch for.
const statusBuffer = 1 << 16

func newInterest(nc *nats.Conn) (*interest, error) {
	in := &interest{ch: make(chan *nats.Msg, statusBuffer), base: nc.NewInbox() + ".",
		done: make(chan struct{})}
	sub, err := nc.ChanSubscribe(in.base+">", in.ch)
	if err != nil {
		return nil, fmt.Errorf("bridge: subscribe to the delivery statuses: %w", err)
	}
	in.sub = sub
	go in.run()
	return in, nil
}

func (in *interest) run() {
	for {
		select {
		case <-in.done:
			return
		case m := <-in.ch:
			in.mu.Lock()
			if batch, i, ok := in.parse(m.Subject); ok && batch == in.batch && i < len(in.hit) && noResponders(m) {
				in.hit[i] = true
			}
			in.taken++
			if in.woken != nil && in.taken >= in.until {
				close(in.woken)
				in.woken = nil
			}
			in.mu.Unlock()
		}
	}
}

// noResponders reports whether m is the server's no-responders status, as
// nats.go's request API recognises it.
func noResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// parse reads <base><batch>.<index>.
func (in *interest) parse(subject string) (batch uint64, i int, ok bool) {
	rest, ok := strings.CutPrefix(subject, in.base)
	if !ok {
		return 0, 0, false
	}
	b, idx, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, 0, false
	}
	batch, err := strconv.ParseUint(b, 36, 64)
	if err != nil {
		return 0, 0, false
	}
	n, err := strconv.ParseUint(idx, 36, 31)
	if err != nil {
		return 0, 0, false
	}
	return batch, int(n), true
}

// begin starts batch (> 0, new for every batch) of n deliveries, whose
// reply subjects reply then returns. The caller holds the publisher's send
// lock until end or abort.
func (in *interest) begin(batch uint64, n int) (dropped int) {
	in.mu.Lock()
	in.batch = batch
	if cap(in.hit) >= n {
		in.hit = in.hit[:n]
		clear(in.hit)
	} else {
		in.hit = make([]bool, n)
	}
	in.mu.Unlock()
	// Every reply subject of the batch is cut from one string: one
	// allocation per batch, not one per delivery.
	prefix := strconv.AppendUint(append(in.buf[:0], in.base...), batch, 36)
	prefix = append(prefix, '.')
	b := append(in.buf[:0], prefix...)
	in.ends = in.ends[:0]
	for i := range n {
		if i > 0 {
			b = append(b, prefix...)
		}
		b = strconv.AppendUint(b, uint64(i), 36)
		in.ends = append(in.ends, len(b))
	}
	in.buf = b[:0]
	in.replies = string(b)
	dropped, _ = in.sub.Dropped()
	return dropped
}

// reply is the reply subject of delivery i of the batch begun.
func (in *interest) reply(i int) string {
	start := 0
	if i > 0 {
		start = in.ends[i-1]
	}
	return in.replies[start:in.ends[i]]
}

// end waits, after the batch's flush returned, until every message
// delivered to the subscription by then is taken, and returns which
// deliveries reached no subscriber. ok is false when that cannot be known:
// ctx ended first, or nats.go dropped a message since begin.
func (in *interest) end(ctx context.Context, dropped int) (hit []bool, ok bool) {
	delivered, err := in.sub.Delivered()
	ok = err == nil
	if ok {
		in.mu.Lock()
		var woken chan struct{}
		if in.taken < delivered {
			woken = make(chan struct{})
			in.woken, in.until = woken, delivered
		}
		in.mu.Unlock()
		if woken != nil {
			select {
			case <-woken:
			case <-ctx.Done():
				ok = false
			}
		}
	}
	if now, err := in.sub.Dropped(); err != nil || now != dropped {
		ok = false
	}
	in.mu.Lock()
	hit = append([]bool(nil), in.hit...)
	in.batch, in.woken = 0, nil
	in.mu.Unlock()
	return hit, ok
}

// abort ends a batch without checked deliveries.
func (in *interest) abort() {
	in.mu.Lock()
	in.batch = 0
	in.mu.Unlock()
}

func (in *interest) close() {
	close(in.done)
	_ = in.sub.Unsubscribe()
}

// errNoInterest is the error of a core delivery that reached no
// subscriber.
func errNoInterest(target string) error {
	return fmt.Errorf("publish to %s: %w (the server answered no responders)", target, scanner.ErrNoInterest)
}
