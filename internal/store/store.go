// Package store owns everything delayd keeps in Redis: key names, Lua
// scripts and the client. No other package speaks Redis.
package store

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
)

// Store is the sharded delay set in one Redis deployment.
type Store struct {
	rdb    redis.UniversalClient
	ns     string
	shards int
	keys   []shardKeys
	// cluster: every script call must stay within one shard's slot.
	cluster bool
	// lastReload throttles cluster topology reloads (unix nanos).
	lastReload atomic.Int64
	// noFlags: the server does not know Lua script flags (see script).
	noFlags atomic.Bool
	// newest is the newest stored format this daemon reads; write is the
	// format it writes now (AgreeFormats).
	newest int
	write  atomic.Int32
	// hint picks the k of a claim's token (scripts.go); tests narrow it.
	hint func() int
	// seenFor is how long a shard remembers a stream message it stored.
	seenFor time.Duration
	// claimTurn picks the first shard of a byte-bounded claim that may
	// hand out one envelope beyond its share; claimMax is the largest
	// value the last claim handed out.
	claimTurn atomic.Uint64
	claimMax  atomic.Int64
	// wait: writes are confirmed by replicas (wait.go).
	wait    WaitOptions
	waiting waiting
}

// Option configures a Store.
type Option func(*Store)

// WithNewestFormat makes the store read formats up to f (FormatHeader, or
// one more, which only tests define) and write it once every live daemon
// reads it: it stands in for the next version in tests of mixed fleets.
func WithNewestFormat(f int) Option {
	return func(s *Store) { s.newest = min(max(f, FormatHeader), formatNext) }
}

// WithTokenHint replaces the source of the k of claim tokens (1..991).
// Tests narrow it to provoke equal hints; tokens stay unique regardless.
func WithTokenHint(hint func() int) Option {
	return func(s *Store) { s.hint = hint }
}

// WithStreamMemory sets how long a shard remembers the stream messages it
// stored (default 5m): longer than the stream redelivers a message whose
// ack was lost.
func WithStreamMemory(d time.Duration) Option {
	return func(s *Store) { s.seenFor = d }
}

// failed reacts to a failed call. Under Cluster, go-redis refreshes its
// slot map on MOVED/ASK, or once a minute: a master that died (connection
// refused) while its replica took over would otherwise be dialled for up to
// a minute. So a failure asks for a fresh map, at most twice a second.
func (s *Store) failed(err error) {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok || err == nil {
		return
	}
	now := time.Now().UnixNano()
	last := s.lastReload.Load()
	if now-last < int64(500*time.Millisecond) || !s.lastReload.CompareAndSwap(last, now) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		cc.ReloadState(ctx)
	}()
}

// Options selects the Redis deployment.
type Options struct {
	// Addrs are host:port, or rediss://host:port for TLS.
	Addrs    []string
	Username string
	Password string
	DB       int
	// TLS, if not nil, is used for every connection (CA, client cert).
	// A rediss:// address turns TLS on with the system roots if it is nil.
	TLS *tls.Config
	// Cluster forces Redis Cluster with one address (several imply it).
	Cluster bool
	// MasterName selects Sentinel; Addrs are then the sentinels.
	MasterName string
	// OnConnect, if set, runs on every new connection (to every node):
	// delayd checks there that Redis does not evict keys.
	OnConnect func(ctx context.Context, cn *redis.Conn) error
	// WaitTimeout is redis.wait_timeout when writes wait for replicas: a
	// pipeline's reply then takes that much longer (WithWait).
	WaitTimeout time.Duration
}

// NewClient builds a go-redis client for the options. A single address
// gives a plain client; several give a Cluster client.
func NewClient(o Options) redis.UniversalClient {
	addrs := make([]string, len(o.Addrs))
	for i, a := range o.Addrs {
		lower := strings.ToLower(a)
		if !strings.HasPrefix(lower, "redis://") && !strings.HasPrefix(lower, "rediss://") {
			addrs[i] = a
			continue
		}
		// A URL: its credentials and database go to the options, so the
		// address that reaches dial errors, logs and /readyz holds none.
		u, err := url.Parse(a)
		if err != nil {
			addrs[i] = redactAddr(a)
			continue
		}
		if strings.EqualFold(u.Scheme, "rediss") && o.TLS == nil {
			o.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if u.User != nil && o.Username == "" && o.Password == "" {
			o.Username = u.User.Username()
			o.Password, _ = u.User.Password()
		}
		if db, err := strconv.Atoi(strings.TrimPrefix(u.Path, "/")); err == nil && o.DB == 0 {
			o.DB = db
		}
		addrs[i] = u.Host
		if u.Port() == "" {
			addrs[i] = net.JoinHostPort(u.Hostname(), "6379")
		}
	}
	if o.TLS != nil && o.TLS.ServerName == "" && len(addrs) > 0 {
		// Verify the certificate against the host we dial.
		o.TLS = o.TLS.Clone()
		o.TLS.ServerName = addrs[0]
		if host, _, err := net.SplitHostPort(addrs[0]); err == nil {
			o.TLS.ServerName = host
		}
	}
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:     addrs,
		Username:  o.Username,
		Password:  o.Password,
		DB:        o.DB,
		TLSConfig: o.TLS,
		// go-redis follows MOVED and ASK and retries TRYAGAIN and
		// CLUSTERDOWN within these redirects.
		MaxRedirects:  3,
		IsClusterMode: o.Cluster,
		MasterName:    o.MasterName,
		// Fail fast and let the callers back off: the intake answers 503
		// and the scanner retries, neither should hang on a dead Redis.
		DialTimeout: 2 * time.Second,
		// One dial per call: go-redis would otherwise retry a refused
		// dial five times with backoff, holding a whole pipeline (every
		// shard) for seconds while one Cluster master is down. The store's
		// callers retry with their own backoff.
		DialerRetries:      1,
		DialerRetryTimeout: 10 * time.Millisecond,
		ReadTimeout:        3*time.Second + o.WaitTimeout,
		WriteTimeout:       3 * time.Second,
		// No silent retries: a retry after a timeout would hide that the
		// first try may have written, and the intake must know whether
		// "nothing stored" is true. The callers retry.
		MaxRetries: -1,
		OnConnect:  o.OnConnect,
	})
}

// redactAddr drops anything before an "@" of an address that would not
// parse, so a password in it never reaches a log.
func redactAddr(a string) string {
	if i := strings.LastIndex(a, "@"); i >= 0 {
		return "REDACTED@" + a[i+1:]
	}
	return a
}

// New returns a store over rdb with the namespace and fixed shard count.
func New(rdb redis.UniversalClient, ns string, shards int, opts ...Option) *Store {
	_, cluster := rdb.(*redis.ClusterClient)
	s := &Store{rdb: rdb, ns: ns, shards: shards, keys: make([]shardKeys, shards), cluster: cluster,
		newest: FormatHeader, hint: func() int { return 1 + rand.IntN(991) }, seenFor: 5 * time.Minute}
	for _, o := range opts {
		o(s)
	}
	s.installWait()
	// Until the fleet's formats are known, the oldest this rule knows:
	// every daemon since it reads it.
	s.write.Store(FormatHeader)
	for i := range s.keys {
		s.keys[i] = keysFor(ns, i)
	}
	return s
}

// Shards is the number of shards.
func (s *Store) Shards() int { return s.shards }

// Shard is the shard an id lives in.
func (s *Store) Shard(id string) int { return ShardOf(id, s.shards) }

// Close closes the Redis client.
func (s *Store) Close() error { return s.rdb.Close() }

// Ping checks that Redis answers and loads the scripts, so the first
// requests do not pay for NOSCRIPT round trips.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	for _, sc := range allScripts {
		if err := s.load(ctx, sc); err != nil {
			return fmt.Errorf("store: load scripts: %w", err)
		}
	}
	return nil
}

// Item is one envelope to schedule.
type Item struct {
	ID string
	// Exactly one applies: AtMicros is absolute (µs since the epoch) when
	// Absolute is set, else DelayMicros is added to Redis' own time.
	Absolute    bool
	AtMicros    int64
	DelayMicros int64
	// Series: the envelope is a recurring series, and its first
	// occurrence is due at AtMicros or after DelayMicros.
	Series bool
	Data   []byte
	// StreamMsg names the intake stream message the item came from
	// (sequence and publish time), "" for a request: a shard that stored
	// it already does not store it again (Schedule returns due 0).
	StreamMsg string
}

// Schedule upserts items and returns each one's due time in ms since the
// epoch (0 for a stream message stored already, which is left as it is),
// and per item the error that kept it from being stored (nil when
// stored). An error wraps ErrNotWritten when the item is certainly not
// stored, else ErrOutcomeUnknown. On a single Redis the whole batch is one
// script call; under Cluster it is one call per shard (a script must stay
// in one slot), all in one pipeline, and a failed node fails only its shards.
func (s *Store) Schedule(ctx context.Context, items []Item) ([]int64, []error) {
	type call struct {
		idx   []int
		keys  []string
		args  []any
		slots map[int]int // shard → KEYS offset
	}
	var calls []*call
	byShard := map[int]*call{}
	ctx, req := s.waitCtx(ctx, "schedule")
	var fences []int // shards whose calls may write nothing (wait.go)
	mark := markOf(int(s.write.Load()))
	lead := []any{int(mark), s.seenFor.Milliseconds()}
	for i, it := range items {
		sh := s.Shard(it.ID)
		c := byShard[sh]
		if c == nil {
			if s.cluster || len(calls) == 0 {
				c = &call{slots: map[int]int{}, args: append([]any{}, lead...)}
				calls = append(calls, c)
			} else {
				c = calls[0]
			}
			byShard[sh] = c
		}
		off, ok := c.slots[sh]
		if !ok {
			off = len(c.keys)
			c.slots[sh] = off
			c.keys = append(c.keys, s.keys[sh].list()...)
		}
		mode, us, v := "d", it.DelayMicros, it.Data
		if it.Series && !it.Absolute {
			mode = "e"
		}
		if it.Absolute {
			occurrence := int64(0)
			if it.Series {
				occurrence = 1
			}
			mode, us, v = "v", it.AtMicros, stampValue(mark, ceilMs(it.AtMicros), occurrence, it.Data)
		}
		c.idx = append(c.idx, i)
		c.args = append(c.args, off, it.ID, mode, us, v, it.StreamMsg)
		if req != nil && it.StreamMsg != "" && (s.cluster || len(fences) == 0) && !slices.Contains(fences, sh) {
			// A stream message stored already is answered without a write.
			fences = append(fences, sh)
		}
	}
	cmds, _ := s.pipelinedOnce(ctx, scheduleScript, len(calls), func(i int) ([]string, []any) {
		return calls[i].keys, calls[i].args
	}, fences, true)
	due := make([]int64, len(items))
	errs := make([]error, len(items))
	for ci, cmd := range cmds {
		vals, err := cmd.Int64Slice()
		if err == nil && len(vals) != len(calls[ci].idx) {
			err = fmt.Errorf("bad reply %v", vals)
		}
		if err != nil {
			err = fmt.Errorf("store: schedule: %w", classify(err, s.cluster))
		}
		// Written but not confirmed: the due time is still returned, the
		// envelope is on the master and falls due there.
		short := req.confirmed(cmd)
		for j, i := range calls[ci].idx {
			due[i], errs[i] = -1, err
			if err != nil {
				continue
			}
			due[i] = vals[j]
			why := short
			if why == nil && vals[j] == 0 {
				why = req.fenceFailed()
			}
			if why != nil {
				errs[i] = fmt.Errorf("store: schedule: %w", why)
			}
		}
	}
	return due, errs
}

// pipelined runs n calls of one script in a pipeline with EVALSHA. If Redis
// lost its script cache (restart, failover, SCRIPT FLUSH) it loads the script
// and resends only the calls that failed with NOSCRIPT: those did not run,
// while the others did and must not run twice. On error the commands are
// returned too, each with its own result: under Cluster one node can fail
// while the others answer.
func (s *Store) pipelined(ctx context.Context, sc *script, n int, call func(i int) ([]string, []any)) ([]*redis.Cmd, error) {
	return s.pipelinedOnce(ctx, sc, n, call, nil, true)
}

// pipelinedOnce is pipelined, reloading the script once if reload is set;
// the pipeline ends with the fences of the shards in fences (wait.go).
func (s *Store) pipelinedOnce(ctx context.Context, sc *script, n int, call func(i int) ([]string, []any), fences []int,
	reload bool) ([]*redis.Cmd, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, n)
	rs := s.pick(sc)
	for i := range n {
		keys, args := call(i)
		cmds[i] = rs.EvalSha(ctx, pipe, keys, args...)
	}
	fenced := make([]*redis.Cmd, len(fences))
	for i, sh := range fences {
		fenced[i] = s.fence(ctx, pipe, sh)
	}
	_, err := pipe.Exec(ctx)
	for _, f := range fenced {
		if f.Err() != nil {
			waitFrom(ctx).fenced(f.Err())
		}
	}
	if err == nil {
		return cmds, nil
	}
	var redo []int
	for i, c := range cmds {
		if reload && c.Err() != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			redo = append(redo, i)
		}
	}
	if len(redo) > 0 && s.load(ctx, sc) == nil {
		again, _ := s.pipelinedOnce(ctx, sc, len(redo), func(j int) ([]string, []any) { return call(redo[j]) }, fences, false)
		for j, i := range redo {
			cmds[i] = again[j]
		}
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			s.failed(err)
			return cmds, err
		}
	}
	return cmds, nil
}

// run is one call of sc.
func (s *Store) run(ctx context.Context, sc *script, keys []string, args ...any) *redis.Cmd {
	cmds, _ := s.pipelined(ctx, sc, 1, func(int) ([]string, []any) { return keys, args })
	return cmds[0]
}

// Cancelled is the outcome of a cancel.
type Cancelled struct {
	// Existed: the envelope was stored, and is removed now.
	Existed bool
	// InFlight: a delivery may already be out: it was claimed for
	// delivery when cancelled, or an earlier attempt was made whose
	// publish was not confirmed.
	InFlight bool
}

// Cancel removes the envelope with id, wherever it is. An error wraps
// ErrNotWritten or ErrOutcomeUnknown.
func (s *Store) Cancel(ctx context.Context, id string) (Cancelled, error) {
	sh := s.Shard(id)
	ctx, req := s.waitCtx(ctx, "cancel")
	var fences []int
	if req != nil {
		fences = []int{sh} // a cancel of an id not stored writes nothing
	}
	cmds, _ := s.pipelinedOnce(ctx, cancelScript, 1, func(int) ([]string, []any) { return s.keys[sh].list(), []any{id} },
		fences, true)
	codes, err := cmds[0].Int64Slice()
	if err == nil && len(codes) != 1 {
		err = fmt.Errorf("bad reply %v", codes)
	}
	if err != nil {
		return Cancelled{}, fmt.Errorf("store: cancel: %w", classify(err, s.cluster))
	}
	if err := req.confirmed(cmds[0]); err != nil {
		return Cancelled{}, fmt.Errorf("store: cancel: %w", err)
	}
	if codes[0] == 0 {
		if err := req.fenceFailed(); err != nil {
			return Cancelled{}, fmt.Errorf("store: cancel: %w", err)
		}
	}
	return Cancelled{Existed: codes[0] > 0, InFlight: codes[0] == 2}, nil
}

// Purge deletes the given ids if they are in the dead set, and returns how
// many were.
func (s *Store) Purge(ctx context.Context, ids []string) (int, error) {
	cmds, err := s.perShard(ctx, cancelScript, ids, "")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range cmds {
		codes, _ := c.Int64Slice()
		for _, v := range codes {
			if v > 0 {
				n++
			}
		}
	}
	return n, nil
}

// Replay moves the given dead ids back to due at once with a fresh attempt
// count, and returns how many were dead.
func (s *Store) Replay(ctx context.Context, ids []string) (int, error) {
	cmds, err := s.perShard(ctx, replayScript, ids)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range cmds {
		if v, _ := c.Int64Slice(); len(v) == 2 {
			n += int(v[1])
		}
	}
	return n, nil
}

// perShard runs sc once per shard over the ids of that shard, in one
// pipeline, with lead prepended to each call's ARGV.
func (s *Store) perShard(ctx context.Context, sc *script, ids []string, lead ...any) ([]*redis.Cmd, error) {
	byShard := map[int][]any{}
	for _, id := range ids {
		sh := s.Shard(id)
		if byShard[sh] == nil {
			byShard[sh] = append([]any{}, lead...)
		}
		byShard[sh] = append(byShard[sh], id)
	}
	shards := make([]int, 0, len(byShard))
	for sh := range byShard {
		shards = append(shards, sh)
	}
	cmds, err := s.pipelined(ctx, sc, len(shards), func(i int) ([]string, []any) {
		return s.keys[shards[i]].list(), byShard[shards[i]]
	})
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return cmds, nil
}

// Claimed is one envelope handed out for delivery.
type Claimed struct {
	ID      string
	DueMs   int64 // the original due time, stable across redeliveries
	Attempt int
	// Base is how many attempts were made before the envelope's last
	// replay: Attempt - Base is the try within its current budget.
	Base int
	// Occurrence is which occurrence of a series this is (from 1), 0 for
	// a one-shot.
	Occurrence int64
	Data       []byte
	// Token names the claim (its lease score): only a settle with it
	// changes the envelope.
	Token string
}

// ClaimResult is what one shard's claim returns, in Redis time.
type ClaimResult struct {
	Shard       int
	NowMicros   int64
	NextDueMs   int64 // -1 when nothing else is pending
	NextLeaseMs int64 // earliest lease expiry, -1 when nothing is in flight
	// Missing counts due ids whose data was gone (deleted outside delayd);
	// they are dropped, and reported so nothing vanishes silently.
	Missing int
	// Expired counts the items re-claimed because their lease expired (a
	// daemon died or stalled while delivering them).
	Expired int
	// Oversize: this shard could hand out its first envelope beyond its
	// share of ClaimOptions.Bytes.
	Oversize bool
	// Unknown counts values of a format newer than this daemon reads,
	// given back untouched; UnknownFormat is the newest of them.
	Unknown       int
	UnknownFormat int
	Items         []Claimed
	// Unconfirmed: with redis.wait_replicas, the claim's wait fell short
	// (Why says how). Its items are handed out all the same: a failover
	// before the replicas have it can bring back the previous attempt
	// number, so a redelivery may repeat an attempt.
	Unconfirmed bool
	Why         error
}

// NowMs is the claim's Redis time in whole milliseconds.
func (r ClaimResult) NowMs() int64 { return r.NowMicros / 1000 }

// ClaimOptions bound one claim.
type ClaimOptions struct {
	Batch int
	Lease time.Duration
	// Bytes bounds the stored bytes the whole claim hands out (0: no
	// bound), split evenly over its shards; each shard hands out what fits
	// in its share, and a few shards, in turn from claim to claim, their
	// first envelope even if that alone is larger: as many as Bytes holds
	// of the largest value the last claim handed out (one when unknown, at
	// most maxOversize). So large envelopes still go out several per claim,
	// no envelope is too large to ever go out, and a claim holds about
	// Bytes plus one payload, at most Bytes plus maxOversize payloads.
	Bytes int64
}

// Claim atomically takes up to Batch envelopes from each of shards, with a
// lease, in one pipeline: one round trip however many shards are due.
// Envelopes whose lease expired come first, then due ones. Concurrent
// claims from many daemons never hand out one envelope twice.
// If some shards' Redis nodes fail (a Cluster master down), it returns the
// results of the others along with the error.
func (s *Store) Claim(ctx context.Context, shards []int, o ClaimOptions) ([]ClaimResult, error) {
	hint, known := s.hint(), int(markOf(s.newest))+1
	ctx, req := s.waitCtx(ctx, "claim")
	var share int64
	first, over := 0, 0 // shards first.. (wrapping) may hand out one envelope beyond their share
	if o.Bytes > 0 && len(shards) > 0 {
		share = max(o.Bytes/int64(len(shards)), 1)
		first = int(s.claimTurn.Add(1) % uint64(len(shards)))
		// As many as the budget holds of the largest value the last claim
		// handed out (one when unknown), at most maxOversize: envelopes
		// larger than a shard's share still go out several per claim.
		over = 1
		if m := s.claimMax.Load(); m > 0 {
			over = int(min(max(o.Bytes/m, 1), maxOversize))
		}
		over = min(over, len(shards))
	}
	oversize := func(i int) bool { return over > 0 && (i-first+len(shards))%len(shards) < over }
	cmds, perr := s.pipelined(ctx, claimScript, len(shards), func(i int) ([]string, []any) {
		over := "0"
		if oversize(i) {
			over = "1"
		}
		return s.keys[shards[i]].list(), []any{o.Batch, o.Lease.Milliseconds(), hint, known, share, over}
	})
	if perr != nil {
		perr = fmt.Errorf("store: claim: %w", perr)
	}
	out := make([]ClaimResult, 0, len(shards))
	short := false
	var largest int64
	for i, cmd := range cmds {
		raw, err := cmd.Slice()
		if err != nil {
			continue // this shard's node failed: perr says so
		}
		why := req.confirmed(cmd)
		short = short || why != nil
		const head = 8
		if len(raw) < head || (len(raw)-head)%3 != 0 {
			return nil, fmt.Errorf("store: claim shard %d: malformed reply of %d values", shards[i], len(raw))
		}
		r := ClaimResult{
			Shard: shards[i], Oversize: oversize(i), NowMicros: asInt(raw[0]), NextDueMs: asInt(raw[1]), NextLeaseMs: asInt(raw[2]),
			Missing: int(asInt(raw[3])), Expired: int(asInt(raw[4])), Unknown: int(asInt(raw[6])),
			Items: make([]Claimed, 0, (len(raw)-head)/3), Unconfirmed: why != nil, Why: why,
		}
		if m := asInt(raw[7]); m > 0 {
			r.UnknownFormat = formatOf(string([]byte{byte(m)}))
		}
		lease, _ := raw[5].(string)
		for j := head; j < len(raw); j += 3 {
			id, _ := raw[j].(string)
			v, _ := raw[j+2].(string)
			// The script stamps values stored by older versions.
			due, occurrence, data := splitValue(v)
			largest = max(largest, int64(len(v)))
			attempt, base := parseAttempt(raw[j+1])
			r.Items = append(r.Items, Claimed{ID: id, DueMs: due, Attempt: attempt, Base: base, Occurrence: occurrence,
				Data: data, Token: lease})
		}
		out = append(out, r)
	}
	if len(out) > 0 {
		s.claimWaited(req, short)
	}
	if largest > 0 {
		s.claimMax.Store(largest)
	}
	return out, perr
}

// maxOversize bounds the shards of one claim that may hand out an envelope
// beyond their share of its byte budget: a claim holds at most the budget
// plus this many payloads, even right after payloads grew.
const maxOversize = 16

// parseAttempt reads a claim's attempt: a number, or "attempt/base" for an
// envelope replayed after base attempts.
func parseAttempt(v any) (attempt, base int) {
	if str, ok := v.(string); ok {
		a, b, _ := strings.Cut(str, "/")
		attempt, _ = strconv.Atoi(a)
		base, _ = strconv.Atoi(b)
		return attempt, base
	}
	return int(asInt(v)), 0
}

// Outcome is what becomes of a claimed envelope.
type Outcome byte

// The outcomes of a delivery.
const (
	Delivered Outcome = 'a' // published: delete it
	Retry     Outcome = 'r' // failed: due again after the retry delay
	Postpone  Outcome = 'u' // never sent: like Retry, the attempt given back
	Bury      Outcome = 'd' // failed for the last time: to the dead set
	// Next: an occurrence of a series was published; the next one is due
	// at NextDueMs, with fresh attempts.
	Next Outcome = 'n'
)

// Settle is the outcome of one delivery.
type Settle struct {
	ID      string
	Token   string // of the claim being settled
	Outcome Outcome
	Error   string // why it failed, kept for inspection (Retry, Bury)
	// NextDueMs is when the next occurrence is due (Next).
	NextDueMs int64
	// RetryDelay, if > 0, replaces Ack's retry delay for this one (Retry,
	// Postpone).
	RetryDelay time.Duration
}

// Acked is what an Ack did.
type Acked struct {
	// Settled counts the settles whose token was still the claim; Buried
	// those of them that moved an envelope to the dead set.
	Settled, Buried int
	NowMs           int64 // Redis time
}

// Ack settles deliveries, one script call per shard, all in one pipeline.
// On error, byShard is left holding only the shards that were not settled,
// and the result counts those that were.
// Released envelopes are due again after retry. A settle whose token is no
// longer the envelope's claim (replaced, cancelled or re-claimed meanwhile)
// is ignored.
func (s *Store) Ack(ctx context.Context, byShard map[int][]Settle, retry time.Duration) (Acked, error) {
	// Calls of at most ackChunk envelopes keep one script call short.
	type call struct {
		shard int
		items []Settle
	}
	var calls []call
	for sh, items := range byShard {
		for len(items) > ackChunk {
			calls = append(calls, call{sh, items[:ackChunk]})
			items = items[ackChunk:]
		}
		calls = append(calls, call{sh, items})
	}
	cmds, err := s.pipelined(ctx, ackScript, len(calls), func(i int) ([]string, []any) {
		items := calls[i].items
		args := make([]any, 0, 1+5*len(items))
		args = append(args, retry.Milliseconds())
		for _, it := range items {
			op := string(it.Outcome)
			switch it.Outcome {
			case 0:
				op = string(Delivered)
			case Next:
				op = "n:" + strconv.FormatInt(it.NextDueMs, 10)
			}
			delay := ""
			if it.RetryDelay > 0 {
				delay = strconv.FormatInt(it.RetryDelay.Milliseconds(), 10)
			}
			args = append(args, it.ID, it.Token, op, it.Error, delay)
		}
		return s.keys[calls[i].shard].list(), args
	})
	var a Acked
	for _, c := range cmds {
		if v, _ := c.Int64Slice(); len(v) == 3 {
			a.NowMs = max(a.NowMs, v[0])
			a.Settled += int(v[1])
			a.Buried += int(v[2])
		}
	}
	if err != nil {
		// Keep only what was not settled, so a retry resends just that.
		for sh := range byShard {
			delete(byShard, sh)
		}
		for i, c := range cmds {
			if c.Err() != nil {
				byShard[calls[i].shard] = append(byShard[calls[i].shard], calls[i].items...)
			}
		}
		return a, fmt.Errorf("store: ack: %w", err)
	}
	return a, nil
}

// ackChunk bounds the envelopes of one ack script call.
const ackChunk = 1000

// Counts are the sizes of one shard's sets.
type Counts struct {
	Pending, Inflight, Dead int64
}

func asInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// SetLogger routes go-redis' own log lines (dial failures and the like) to
// log at debug level: the store's callers already log what those failures
// mean, once, with backoff. go-redis only offers a process-wide logger.
func SetLogger(log hclog.Logger) {
	redis.SetLogger(redisLogger{log})
}

type redisLogger struct{ log hclog.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug(fmt.Sprintf(format, v...))
}
