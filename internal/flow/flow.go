// Package flow is delayd's flow control: fleet-wide rate limits and pauses
// on target patterns. The rules live in Redis (store/flow.go), so every
// daemon obeys one budget and they survive restarts; each daemon keeps a
// copy, read again every PollInterval.
//
// Flow control acts at the moment of delivery: the scanner asks the Gate,
// for each claimed envelope, whether it goes out now. One held by a limit
// goes back to due at its slot, decided once (GCRA in Redis: a herd of N
// costs O(N)); one of a paused target is parked until its resume. Either
// way it stays pending, cancellable and visible, and is not an attempt.
// Targets no rule matches cost nothing: an empty rule set is one nil check.
package flow

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// PollInterval is how often a daemon reads the rules again. A change made
// through a daemon is answered only after twice this, so every live
// daemon holds it by then (Control).
const PollInterval = time.Second

// heldEvery is how often the Gate reads what each rule holds, for the
// metrics and the console.
const heldEvery = 2 * time.Second

// strayEvery is how often the Gate looks for parked envelopes no pause
// holds and no list names (ReleaseStrays).
const strayEvery = 5 * time.Minute

// retryUnread is how long an envelope waits when its rule's state cannot
// be read (Redis failing): given back, not an attempt, rather than sent
// over a limit.
const retryUnread = time.Second

// MaxPattern bounds a rule's pattern, in bytes.
const MaxPattern = 256

// MaxRate bounds a limit: one delivery per µs.
const MaxRate = 1_000_000

// ErrBadRule marks a rule refused for what it says (a pattern, rate or
// burst that cannot be), not for Redis failing.
var ErrBadRule = errors.New("bad rule")

// ParseRate reads a rate, "N/s", "N/m" or "N/h" (N a whole number > 0, at
// most MaxRate a second), into its emission interval in µs, rounded up
// (never faster than asked).
func ParseRate(s string) (int64, error) {
	if strings.ContainsFunc(s, unicode.IsSpace) {
		return 0, fmt.Errorf("%w: rate %q: no spaces, such as 500/s", ErrBadRule, s)
	}
	n, unit, ok := strings.Cut(s, "/")
	per := map[string]int64{"s": 1e6, "m": 60e6, "h": 3600e6}[unit]
	count, err := strconv.ParseInt(n, 10, 64)
	if !ok || per == 0 || err != nil || count < 1 || n[0] < '0' || n[0] > '9' {
		return 0, fmt.Errorf("%w: rate %q: want a whole number of deliveries per s, m or h, such as 500/s, 30/m or 10/h", ErrBadRule, s)
	}
	if count > MaxRate*per/1e6 {
		return 0, fmt.Errorf("%w: rate %q: at most %d/s", ErrBadRule, s, MaxRate)
	}
	return (per + count - 1) / count, nil
}

// CheckPattern refuses what cannot be a rule's pattern.
func CheckPattern(p string) error {
	switch {
	case len(p) > MaxPattern:
		return fmt.Errorf("%w: pattern of %d bytes: at most %d", ErrBadRule, len(p), MaxPattern)
	case !utf8.ValidString(p):
		// A metric label must be UTF-8: such a pattern in the rules made
		// the metrics panic, on every daemon in turn (found by review).
		return fmt.Errorf("%w: pattern %q is not UTF-8", ErrBadRule, p)
	case !envelope.ValidPattern(p):
		return fmt.Errorf("%w: %q is not a subject pattern (tokens separated by dots, * for one token, > for the rest)", ErrBadRule, p)
	}
	return nil
}

// Rules is one reading of the fleet's rules, with the limits ordered for
// matching: a target obeys the most specific limit that matches it (the
// most literal tokens, then the most tokens, then by pattern).
type Rules struct {
	limits []store.Limit
	paused map[string]int64
	// leftover: kind ("parked", "slotted") → patterns whose list may
	// still hold envelopes.
	leftover map[string][]string
}

func newRules(r store.FlowRules) *Rules {
	ls := slices.Clone(r.Limits)
	slices.SortFunc(ls, func(a, b store.Limit) int {
		la, ta := specificity(a.Pattern)
		lb, tb := specificity(b.Pattern)
		switch {
		case la != lb:
			return lb - la
		case ta != tb:
			return tb - ta
		}
		return strings.Compare(a.Pattern, b.Pattern)
	})
	return &Rules{limits: ls, paused: r.Paused, leftover: map[string][]string{"parked": r.Parked, "slotted": r.Slotted}}
}

func specificity(p string) (literal, tokens int) {
	for t := range strings.SplitSeq(p, ".") {
		tokens++
		if t != "*" && t != ">" {
			literal++
		}
	}
	return literal, tokens
}

func (r *Rules) empty() bool { return r == nil || len(r.limits) == 0 && len(r.paused) == 0 }

// limitFor is the limit target obeys, if any.
func (r *Rules) limitFor(target string) (store.Limit, bool) {
	for _, l := range r.limits {
		if envelope.Match(l.Pattern, target) {
			return l, true
		}
	}
	return store.Limit{}, false
}

// pausedBy is the first (by pattern) pause that holds target, if any.
func (r *Rules) pausedBy(target string) (string, bool) {
	var by string
	for p := range r.paused {
		if envelope.Match(p, target) && (by == "" || p < by) {
			by = p
		}
	}
	return by, by != ""
}

// Store is the part of the store the Gate reads and writes.
type Store interface {
	FlowRules(ctx context.Context) (store.FlowRules, error)
	SetLimit(ctx context.Context, l store.Limit) error
	Reserve(ctx context.Context, l store.Limit, ids []string, dueMs []int64) (int64, []int64, error)
	Park(ctx context.Context, pattern string, ids []string, dueMs []int64, limits []string) error
	ReleaseLeftover(ctx context.Context, kind, pattern string) (int, error)
	ReleaseStrays(ctx context.Context, keep func(data []byte) bool) (int, error)
	Held(ctx context.Context, patterns []string) (map[string]store.FlowHeld, error)
}

// Observer is told what the Gate does, for metrics. Every method must be
// cheap.
type Observer interface {
	// Held counts n envelopes held back by a rule (reason "limit" or
	// "pause").
	Held(pattern, reason string, n int)
	// Allowed records a delivery a limit let go at its slot, waited after
	// its due time.
	Allowed(pattern string, waited time.Duration)
}

type nopObserver struct{}

func (nopObserver) Held(string, string, int)      {}
func (nopObserver) Allowed(string, time.Duration) {}

// Decision is what becomes of one envelope the Gate was asked about.
type Decision struct {
	// HoldUntilMs > 0: held, due again then (Redis ms): store.Hold.
	HoldUntilMs int64
	// RetryIn > 0: its rule's state could not be read; given back for
	// that long, not an attempt: store.Postpone. Why says so.
	RetryIn time.Duration
	Why     error
	// Allowed, for one that goes now, is when flow control let it go, if
	// after its due time (a limit's slot, or a resume): its lateness
	// counts from then (envelope.Delivery.Allowed).
	Allowed time.Time
}

// Go reports whether the envelope goes out now.
func (d Decision) Go() bool { return d.HoldUntilMs == 0 && d.RetryIn == 0 }

// Gate decides, for the scanner, which claimed envelopes go out now.
type Gate struct {
	st    Store
	obs   Observer
	log   hclog.Logger
	rules atomic.Pointer[Rules]

	mu sync.Mutex
	// resumed: pattern → when this daemon saw its pause end, for the
	// lateness of what it parked.
	resumed map[string]time.Time
	held    map[string]store.FlowHeld
	failLog atomic.Bool
	badLog  atomic.Bool
	recent  atomic.Int32 // len(resumed), read without the lock
	wake    func()
	// static are the config file's limits (targets.limits), written by
	// the first Refresh that can: before then no limited target is let
	// go, so a fresh namespace is limited from the first claim.
	static      []store.Limit
	staticWrote atomic.Bool
}

// WriteFirst makes the Gate write limits (the config file's) to Redis
// before its first reading of the rules. Call it before Run.
func (g *Gate) WriteFirst(limits []store.Limit) { g.static = limits }

// NewGate returns a Gate with no rules until Run reads them. wake (may be
// nil) makes every shard's owner claim now.
func NewGate(st Store, obs Observer, wake func(), log hclog.Logger) *Gate {
	if obs == nil {
		obs = nopObserver{}
	}
	if wake == nil {
		wake = func() {}
	}
	return &Gate{st: st, obs: obs, log: log, resumed: map[string]time.Time{}, wake: wake}
}

// Refresh reads the rules now; Run calls it every PollInterval. The list
// of a rule that is gone (a pause resumed, a limit removed) may still
// hold envelopes a daemon listed before it saw the change, or that were
// in flight then: this releases them, and leaves a rule set again as it
// is.
func (g *Gate) Refresh(ctx context.Context) error {
	if !g.staticWrote.Load() {
		for _, l := range g.static {
			if err := g.st.SetLimit(ctx, l); err != nil {
				return err
			}
		}
		if g.staticWrote.CompareAndSwap(false, true) {
			for _, l := range g.static {
				g.log.Info("rate limit set from targets.limits", "pattern", l.Pattern, "rate", l.Rate, "burst", l.Burst)
			}
		}
	}
	fr, err := g.st.FlowRules(ctx)
	if err != nil {
		return err
	}
	next, prev := newRules(fr), g.rules.Load()
	g.rules.Store(next)
	if len(fr.Bad) > 0 && g.badLog.CompareAndSwap(false, true) {
		g.log.Error("flow-control rules that do not read are left out (written by hand? remove them with HDEL on the rules hash)",
			"fields", fr.Bad)
	}
	now := time.Now()
	g.mu.Lock()
	if prev != nil {
		for p := range prev.paused {
			if _, still := next.paused[p]; !still {
				g.resumed[p] = now
				g.log.Info("pause ended: its envelopes go out in due order", "pattern", p)
			}
		}
	}
	for p, at := range g.resumed {
		if now.Sub(at) > 10*time.Minute {
			delete(g.resumed, p)
		}
	}
	g.recent.Store(int32(len(g.resumed)))
	g.mu.Unlock()
	for kind, ps := range next.leftover {
		for _, p := range ps {
			if _, paused := next.paused[p]; kind == "parked" && paused {
				continue
			}
			if kind == "slotted" && slices.ContainsFunc(next.limits, func(l store.Limit) bool { return l.Pattern == p }) {
				continue
			}
			n, err := g.st.ReleaseLeftover(ctx, kind, p)
			if err != nil {
				return err
			}
			if n > 0 {
				g.log.Warn("released envelopes the list of a rule that is gone still held", "pattern", p, "list", kind, "count", n)
				g.wake()
			}
		}
	}
	return nil
}

// Run reads the rules every PollInterval, and what they hold every
// heldEvery, until ctx ends.
func (g *Gate) Run(ctx context.Context) error {
	t := time.NewTicker(PollInterval)
	defer t.Stop()
	var lastHeld, lastStray time.Time
	for {
		if err := g.Refresh(ctx); err != nil && ctx.Err() == nil {
			if g.failLog.CompareAndSwap(false, true) {
				g.log.Warn("cannot read the flow-control rules; keeping the last ones read", "error", err)
			}
		} else if err == nil && g.failLog.CompareAndSwap(true, false) {
			g.log.Info("flow-control rules read again")
		}
		if time.Since(lastHeld) >= heldEvery {
			lastHeld = time.Now()
			g.readHeld(ctx)
		}
		if time.Since(lastStray) >= strayEvery {
			lastStray = time.Now()
			g.releaseStrays(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// releaseStrays puts back parked envelopes whose target no pause of the
// rules last read holds: a safety net for a listing lost to a failover of
// the rules' Redis master (Cluster) while its envelope's hold survived on
// another, or a rules hash deleted by hand.
func (g *Gate) releaseStrays(ctx context.Context) {
	r := g.rules.Load()
	if r == nil {
		return // never read: every parked envelope would look stray
	}
	n, err := g.st.ReleaseStrays(ctx, func(data []byte) bool {
		e, err := envelope.Decode(data)
		if err != nil {
			return true // cannot tell: left as it is
		}
		_, paused := r.pausedBy(e.Target)
		return paused
	})
	if err != nil {
		g.log.Debug("looking for parked envelopes no pause holds failed", "error", err)
		return
	}
	if n > 0 {
		g.log.Warn("released parked envelopes that no pause holds and no list named", "count", n)
		g.wake()
	}
}

func (g *Gate) readHeld(ctx context.Context) {
	r := g.rules.Load()
	if r == nil {
		return
	}
	var ps []string
	for _, l := range r.limits {
		ps = append(ps, l.Pattern)
	}
	for p := range r.paused {
		if !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	held, err := g.st.Held(ctx, ps)
	if err != nil {
		return
	}
	g.mu.Lock()
	g.held = held
	g.mu.Unlock()
}

// Ruled reports whether a limit or a pause matches target: only those
// need Admit.
func (g *Gate) Ruled(target string) bool {
	r := g.rules.Load()
	if r == nil {
		return true // never read: Admit reads them
	}
	if r.empty() {
		return false
	}
	if _, ok := r.pausedBy(target); ok {
		return true
	}
	_, ok := r.limitFor(target)
	return ok
}

// Admit decides for each delivery (dueMs: when each was due; nowMs: the
// claim's Redis time) whether it goes out now. Nil when no rule exists:
// all go.
func (g *Gate) Admit(ctx context.Context, ds []envelope.Delivery) []Decision {
	r := g.rules.Load()
	if r == nil {
		// Never read yet (the first claims of a daemon can come before
		// Run's first reading): read now, or hold everything back.
		if err := g.Refresh(ctx); err != nil {
			out := make([]Decision, len(ds))
			for i := range out {
				out[i] = Decision{RetryIn: retryUnread, Why: fmt.Errorf("the flow-control rules were never read: %w", err)}
			}
			return out
		}
		r = g.rules.Load()
	}
	if r.empty() {
		return nil
	}
	out := make([]Decision, len(ds))
	type group struct {
		limit store.Limit
		at    []int
	}
	limited := map[string]*group{}
	parked := map[string][]int{}
	for i, d := range ds {
		if p, ok := r.pausedBy(d.Target); ok {
			parked[p] = append(parked[p], i)
			continue
		}
		if l, ok := r.limitFor(d.Target); ok {
			gr := limited[l.Pattern]
			if gr == nil {
				gr = &group{limit: l}
				limited[l.Pattern] = gr
			}
			gr.at = append(gr.at, i)
			continue
		}
		out[i].Allowed = g.resumedAt(d)
	}
	for p, at := range parked {
		ids, dues, limits := make([]string, len(at)), make([]int64, len(at)), make([]string, len(at))
		for j, i := range at {
			ids[j], dues[j] = ds[i].ID, ds[i].Due.UnixMilli()
			if l, ok := r.limitFor(ds[i].Target); ok {
				limits[j] = l.Pattern
			}
		}
		err := g.st.Park(ctx, p, ids, dues, limits)
		for j, i := range at {
			if err != nil {
				out[i] = Decision{RetryIn: retryUnread, Why: fmt.Errorf("paused by %q, and cannot be parked: %w", p, err)}
				continue
			}
			out[i].HoldUntilMs = store.ParkedBase + dues[j]
		}
		if err == nil {
			g.obs.Held(p, "pause", len(at))
		}
	}
	for p, gr := range limited {
		// Slots in due order: a claim of several shards hands out each
		// shard's envelopes in due order, not the claim's.
		slices.SortStableFunc(gr.at, func(a, b int) int { return ds[a].Due.Compare(ds[b].Due) })
		ids, dues := make([]string, len(gr.at)), make([]int64, len(gr.at))
		for j, i := range gr.at {
			ids[j], dues[j] = ds[i].ID, ds[i].Due.UnixMilli()
		}
		now, slots, err := g.st.Reserve(ctx, gr.limit, ids, dues)
		held := 0
		for j, i := range gr.at {
			switch {
			case err != nil:
				out[i] = Decision{RetryIn: retryUnread, Why: fmt.Errorf("limited by %q, and no slot could be read: %w", p, err)}
			case slots[j] > now:
				out[i].HoldUntilMs = slots[j]
				held++
			default:
				// Its slot, in local time: how long ago Redis says it was.
				due := ds[i].Due
				allowed := time.Now().Add(-time.Duration(now-slots[j]) * time.Millisecond)
				if allowed.After(due) {
					out[i].Allowed = allowed
					g.obs.Allowed(p, allowed.Sub(due))
				} else {
					g.obs.Allowed(p, 0)
				}
			}
		}
		if held > 0 {
			g.obs.Held(p, "limit", held)
		}
	}
	return out
}

// Resumed is when a pause that held d's target ended, if d was due
// before: its lateness counts from then (zero: none). It costs an atomic
// load while no pause ended in the last 10 minutes.
func (g *Gate) Resumed(d envelope.Delivery) time.Time {
	if g.recent.Load() == 0 {
		return time.Time{}
	}
	return g.resumedAt(d)
}

func (g *Gate) resumedAt(d envelope.Delivery) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	var at time.Time
	for p, t := range g.resumed {
		if t.After(d.Due) && t.After(at) && envelope.Match(p, d.Target) {
			at = t
		}
	}
	return at
}

// Status is one pattern's rules and what they hold, as the operator sees
// it.
type Status struct {
	Pattern string
	// Rate ("500/s") and Burst: its limit; Rate is "" without one.
	Rate  string
	Burst int
	// PausedSince is when its pause began (zero: not paused).
	PausedSince time.Time
	store.FlowHeld
}

// Drain is how long the pattern's backlog takes to go out: the limit's
// slots given so far; +Inf while paused with envelopes parked.
func (s Status) Drain() time.Duration {
	if !s.PausedSince.IsZero() && s.Parked > 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s.BacklogMs) * time.Millisecond
}

// Statuses lists the patterns of rules, with what they hold (nil held:
// unknown).
func Statuses(r store.FlowRules, held map[string]store.FlowHeld) []Status {
	by := map[string]*Status{}
	get := func(p string) *Status {
		if by[p] == nil {
			by[p] = &Status{Pattern: p, FlowHeld: held[p]}
		}
		return by[p]
	}
	for _, l := range r.Limits {
		s := get(l.Pattern)
		s.Rate, s.Burst = l.Rate, l.Burst
	}
	for p, since := range r.Paused {
		get(p).PausedSince = time.UnixMilli(since)
	}
	out := make([]Status, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Pattern, b.Pattern) })
	return out
}

// Statuses is what this daemon last read: the rules and what they hold.
func (g *Gate) Statuses() []Status {
	r := g.rules.Load()
	if r == nil {
		return nil
	}
	g.mu.Lock()
	held := g.held
	g.mu.Unlock()
	return Statuses(store.FlowRules{Limits: r.limits, Paused: r.paused}, held)
}

// Limits reads the config file's limits (each as ParseLimit reads it).
func Limits(specs []string) ([]store.Limit, error) {
	out := make([]store.Limit, 0, len(specs))
	for _, spec := range specs {
		pattern, rate, burst, err := ParseLimit(spec)
		if err != nil {
			return nil, err
		}
		interval, _ := ParseRate(rate) // checked by ParseLimit
		out = append(out, store.Limit{Pattern: pattern, Rate: rate, IntervalUs: interval, Burst: burst})
	}
	return out, nil
}

// ParseLimit reads a limit as the config writes it (targets.limits):
// "PATTERN RATE" or "PATTERN RATE BURST", e.g. "orders.> 500/s 50".
func ParseLimit(s string) (pattern, rate string, burst int, err error) {
	f := strings.Fields(s)
	if len(f) < 2 || len(f) > 3 {
		return "", "", 0, fmt.Errorf("limit %q: want \"PATTERN RATE\" or \"PATTERN RATE BURST\", such as \"orders.> 500/s 50\"", s)
	}
	pattern, rate, burst = f[0], f[1], 1
	if err := CheckPattern(pattern); err != nil {
		return "", "", 0, fmt.Errorf("limit %q: %w", s, err)
	}
	if _, err := ParseRate(rate); err != nil {
		return "", "", 0, fmt.Errorf("limit %q: %w", s, err)
	}
	if len(f) == 3 {
		if burst, err = strconv.Atoi(f[2]); err != nil || burst < 1 || burst > MaxBurst {
			return "", "", 0, fmt.Errorf("limit %q: burst %q: want 1..%d", s, f[2], MaxBurst)
		}
	}
	return pattern, rate, burst, nil
}
