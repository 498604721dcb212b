package scanner

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// OwnerStore is what shard ownership needs from Redis.
type OwnerStore interface {
	Heartbeat(ctx context.Context, id string, ttl time.Duration) ([]string, int64, error)
	Own(ctx context.Context, id string, ttl time.Duration, hold, release []int) ([]bool, error)
}

// Ownership keeps this daemon's share of the shards: it heartbeats into the
// member set, computes which shards it should scan from the live members,
// holds those leases and releases the others, and tells the scanner.
//
// The assignment is rendezvous hashing of (member, shard): every daemon
// computes the same answer from the same member list, each gets about
// shards/members, and a member joining or leaving moves only the shards it
// gains or loses, so a rebalance is never a storm. A shard changes hands only
// when its old owner releases it (at its next round) or its lease expires
// (the owner died): two owners never hold one lease, and even a moment of
// double scanning would cost nothing but time, because claims are atomic.
type Ownership struct {
	st     OwnerStore
	sc     *Scanner
	id     string
	ttl    time.Duration
	log    hclog.Logger
	owned  []bool
	failed bool
	// cut counts the rounds in a row that found the delivery connection
	// down; away: this daemon left the member set for it.
	cut  int
	away bool
	// joined: this daemon could deliver since it started. Before, a stand
	// down is the start waiting for its first proof (the inbox
	// self-check, a second or two), not news: the bridge logs a failure
	// of that proof itself, and daemon.waitReady a NATS still unreachable.
	joined bool
	// health, for Ready: guarded by mu.
	mu        sync.Mutex
	lastOK    time.Time
	lastErr   error
	stoodDown bool // away, with lastErr saying why
	members   int
	nOwned    int
}

// NewOwnership manages the shards of sc for the daemon with id. ttl is the
// lease: a dead daemon's shards are taken over within about ttl.
func NewOwnership(st OwnerStore, sc *Scanner, id string, ttl time.Duration, log hclog.Logger) *Ownership {
	return &Ownership{st: st, sc: sc, id: id, ttl: ttl, log: log, owned: make([]bool, len(sc.next))}
}

// Run renews ownership every third of the lease until ctx is done, then
// releases every shard and leaves the member set, so a graceful stop hands
// the shards over at once.
func (o *Ownership) Run(ctx context.Context) error {
	t := time.NewTicker(o.ttl / 3)
	defer t.Stop()
	for {
		o.round(ctx)
		select {
		case <-ctx.Done():
			o.leave()
			return nil
		case <-t.C:
		}
	}
}

func (o *Ownership) round(ctx context.Context) {
	// A daemon that cannot publish must not hold shards: their timers
	// would stall while it reaches Redis but not NATS (a wrong password,
	// a cut network path, an inbox it may not subscribe to). Two rounds
	// in a row, so a reconnect of a fraction of a second does not move
	// every shard; at once when it holds none (it just started).
	if !o.sc.pub.Connected() {
		if o.cut++; (o.cut >= 2 || !o.holds()) && !o.away {
			o.standDown()
		}
		if o.away {
			why := o.unready() // it may have changed (inbox refused, then NATS down)
			o.mu.Lock()
			o.lastErr = why
			o.mu.Unlock()
			return
		}
	} else {
		if o.away {
			if o.joined {
				o.log.Info("can deliver again: rejoining the member set")
			}
			o.mu.Lock()
			o.stoodDown = false
			o.mu.Unlock()
		}
		o.cut, o.away, o.joined = 0, false, true
	}
	rctx, cancel := context.WithTimeout(ctx, o.ttl/3)
	defer cancel()
	members, _, err := o.st.Heartbeat(rctx, o.id, o.ttl)
	if err == nil {
		hold, release := o.plan(members)
		var got []bool
		if got, err = o.st.Own(rctx, o.id, o.ttl, hold, release); err == nil {
			next := make([]bool, len(o.owned))
			for i, sh := range hold {
				next[sh] = got[i]
			}
			o.apply(next, len(members))
		}
	}
	o.mu.Lock()
	if err == nil {
		o.lastOK, o.lastErr = time.Now(), nil
	} else {
		o.lastErr = err
	}
	o.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil && !o.failed {
			o.log.Warn("ownership round failed; leases will lapse if Redis stays away", "error", err)
		}
		o.failed = true
		return
	}
	if o.failed {
		o.log.Info("ownership round recovered")
		o.failed = false
	}
}

// errNoNATS: the daemon stood down because it cannot publish.
var errNoNATS = errors.New("the NATS delivery connection is down: this daemon gave up its shards to daemons that can deliver")

// holds reports whether this daemon owns a shard.
func (o *Ownership) holds() bool {
	for _, own := range o.owned {
		if own {
			return true
		}
	}
	return false
}

// unready is why the publisher cannot publish, as it says (a Publisher
// may implement Down() error), or errNoNATS.
func (o *Ownership) unready() error {
	if u, ok := o.sc.pub.(interface{ Down() error }); ok {
		if err := u.Down(); err != nil {
			return fmt.Errorf("this daemon cannot deliver, and holds no shard until it can: %w", err)
		}
	}
	return errNoNATS
}

// standDown releases every shard and leaves the member set, so the other
// daemons take the shards at their next round.
func (o *Ownership) standDown() {
	o.away = true
	n := 0
	for _, own := range o.owned {
		if own {
			n++
		}
	}
	why := o.unready()
	if o.joined {
		o.log.Warn("cannot deliver: giving up the shards and leaving the member set until it can",
			"shards", n, "error", why)
		o.leave()
	} else {
		// Never a member since it started: nothing to leave.
		o.log.Debug("not delivering yet: joining the member set once it can", "error", why)
	}
	o.owned = make([]bool, len(o.owned))
	o.mu.Lock()
	o.lastErr, o.nOwned, o.stoodDown = why, 0, true
	o.mu.Unlock()
}

// Ready fails while due envelopes may wait for nobody: this daemon's
// ownership rounds fail (its leases lapse), or it owns no shard and is the
// only live member (so no one owns them). A daemon that owns nothing
// because others own everything is ready.
func (o *Ownership) Ready(context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.stoodDown:
		return o.lastErr
	case o.lastOK.IsZero() && o.lastErr == nil:
		return errors.New("no ownership round yet")
	case time.Since(o.lastOK) > o.ttl:
		return fmt.Errorf("shard leases not renewed for over %s: %v", o.ttl, o.lastErr)
	case o.nOwned == 0 && o.members <= 1:
		return errors.New("this daemon owns no shard and no other daemon is alive: nothing is delivered")
	}
	return nil
}

// plan returns the shards this daemon should hold and those it holds but
// should give up.
func (o *Ownership) plan(members []string) (hold, release []int) {
	for sh := range o.owned {
		if winner(members, sh) == o.id {
			hold = append(hold, sh)
		} else if o.owned[sh] {
			release = append(release, sh)
		}
	}
	return hold, release
}

func (o *Ownership) apply(next []bool, members int) {
	changed, n := false, 0
	for sh, own := range next {
		if own != o.owned[sh] {
			changed = true
		}
		if own {
			n++
		}
	}
	o.owned = next
	o.sc.SetOwned(next)
	o.mu.Lock()
	o.members, o.nOwned = members, n
	o.mu.Unlock()
	if changed {
		o.log.Info("shard ownership changed", "owned", n, "shards", len(next), "members", members)
	}
}

func (o *Ownership) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var release []int
	for sh, own := range o.owned {
		if own {
			release = append(release, sh)
		}
	}
	o.sc.SetOwned(make([]bool, len(o.owned)))
	if _, err := o.st.Own(ctx, o.id, o.ttl, nil, release); err != nil {
		o.log.Warn("releasing shards failed; they pass on when the leases expire", "error", err)
	}
	if _, _, err := o.st.Heartbeat(ctx, o.id, 0); err != nil {
		o.log.Warn("leaving the member set failed", "error", err)
	}
	if len(release) > 0 {
		o.log.Info("released shards", "count", len(release))
	}
}

// winner is the member with the highest rendezvous hash for shard.
func winner(members []string, shard int) string {
	best, bestScore := "", uint64(0)
	suffix := ":" + strconv.Itoa(shard)
	for _, m := range members {
		h := fnv.New64a()
		_, _ = h.Write([]byte(m + suffix))
		// fnv of similar strings differs in few bits; mix before comparing.
		if score := mix(h.Sum64()); best == "" || score > bestScore {
			best, bestScore = m, score
		}
	}
	return best
}

// mix is the splitmix64 finalizer.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ (x >> 31)
}
