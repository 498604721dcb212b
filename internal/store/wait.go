package store

// Replicated durability on request (redis.wait_replicas, wait_local_fsync).
//
// Redis replicates asynchronously: a write it answered can vanish in a
// failover. WAIT n t blocks the connection that sent it until n replicas
// acknowledged every write that connection made (or t passed) and answers
// how many did; WAITAOF 1 0 t does the same for the master's own AOF fsync.
// So the WAIT must run on the connection of the writes, right after them.
//
// Which operations wait, and how, is their policy (ops.go). exec asks for
// a wait by marking a pipeline's context (waitCtx); a go-redis pipeline
// hook then appends TIME, WAIT, [WAITAOF,] TIME to the commands of each
// connection the pipeline writes on. On a single Redis
// and under Sentinel that is the client's one pipeline connection. Under
// Cluster the hook sits on every node's client (OnNewNode), where go-redis
// hands it the commands it sends to that node on one connection: one WAIT
// per master the batch wrote to, and a call redirected by MOVED or ASK is
// confirmed by the WAIT of the node it finally ran on. The two TIMEs give
// the wait's own duration in Redis time, however long the writes took.
//
// WAIT is documented to count the connection's own previous writes. A
// script that wrote nothing (a stream redelivery stored already, a cancel
// of an id not found) would then be confirmed by an older write of its
// pooled connection, while the write it answers for (an earlier try, on
// another connection) may not have reached a replica yet. Those pipelines
// therefore end with a fence: a tiny write (a 60 s key in the shard's
// slot) that the WAIT then covers, and with it every write the master made
// before. (Redis up to 7.0 moves a connection's offset to the master's on
// every command, so there WAIT alone would do; the fence keeps it right
// whichever way a server counts.)

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated marks a write that Redis made on the master but that
// fewer replicas than redis.wait_replicas confirmed in time (or the master
// did not fsync, with wait_local_fsync): a failover may still lose it. It
// wraps ErrOutcomeUnknown, so a request gets 504 with its id.
var ErrNotReplicated = fmt.Errorf("%w: the write is on the master but was not confirmed by the replicas redis.wait_replicas asks for", ErrOutcomeUnknown)

// WaitObserver is told of every WAIT the store sent: the operation (those
// that wait in ops.go: schedule, cancel, claim), how long it blocked in
// Redis, and whether it fell short. It must be cheap.
type WaitObserver interface {
	Waited(op string, took time.Duration, short bool)
}

// WaitOptions ask for writes to be confirmed before they count.
type WaitOptions struct {
	// Replicas is how many replicas must hold a write (WAIT); 0 asks none.
	Replicas int
	// Timeout bounds each wait (at least 1 ms: WAIT 0 would block forever).
	Timeout time.Duration
	// LocalFsync also waits for the master's AOF fsync (WAITAOF, Redis 7.2).
	LocalFsync bool
	Observer   WaitObserver
}

func (o WaitOptions) on() bool { return o.Replicas > 0 || o.LocalFsync }

// WithWait makes the operations whose policy waits (ops.go: schedules,
// cancels, claims) wait for o (see wait.go).
func WithWait(o WaitOptions) Option {
	return func(s *Store) {
		s.wait = o
		if s.wait.Timeout < time.Millisecond {
			s.wait.Timeout = time.Millisecond
		}
	}
}

// An operation that probes (ops.go: claims) must not add the whole
// timeout to every delivery while one replica is missing: the first short
// claim waits the full timeout; after it, claims do not wait (they are
// unconfirmed anyway), except one probe every claimProbeEvery that waits up to claimProbe, until
// a probe is confirmed. The probe must outlast a healthy replica's round
// trip: a busy Redis checks WAIT timeouts on every pass of its event loop,
// so a short probe would time out before a replica in another zone acks,
// and claims would never wait again. A probe holds one claim round a
// second for at most that long while a replica is missing. Intake always
// waits the full timeout: a 504 is what wait_replicas asks for.
const (
	claimProbe      = 250 * time.Millisecond
	claimProbeEvery = time.Second
)

// probing is the wait state of one operation that probes.
type probing struct {
	// short: the last call that waited fell short; lastProbe is when one
	// last waited (unix nanos).
	short     atomic.Bool
	lastProbe atomic.Int64
}

// errNotWaited marks a call sent without a wait while its operation's
// waits fall short (probes).
var errNotWaited = fmt.Errorf("%w: not waited for, as the last claims' waits fell short (probed every %s)", ErrNotReplicated, claimProbeEvery)

type waitKey struct{}

// waitReq is one store call's request to wait, carried in its context to
// the pipeline hook, which records there what each call's wait found.
type waitReq struct {
	op       string
	replicas int
	fsync    bool
	timeout  time.Duration
	obs      WaitObserver
	mu       sync.Mutex
	ours     map[redis.Cmder]bool  // commands the hook added: never resent
	result   map[redis.Cmder]error // per call: nil once its wait confirmed it
	// skipped: no wait was sent (errNotWaited).
	skipped bool
}

// waitCtx marks ctx so that the pipeline of op waits as w says (op's
// policy), or returns it as it is (and a nil request) when it does not
// wait. Only exec calls it.
func (s *Store) waitCtx(ctx context.Context, op string, w waitMode) (context.Context, *waitReq) {
	if !s.wait.on() || w == neverWaits {
		return ctx, nil
	}
	timeout := s.wait.Timeout
	if p := s.probing[op]; w == probes && p.short.Load() {
		now, last := time.Now().UnixNano(), p.lastProbe.Load()
		if now-last < int64(claimProbeEvery) || !p.lastProbe.CompareAndSwap(last, now) {
			return ctx, &waitReq{op: op, skipped: true}
		}
		timeout = min(timeout, claimProbe)
	}
	r := &waitReq{op: op, replicas: s.wait.Replicas, fsync: s.wait.LocalFsync, timeout: timeout, obs: s.wait.Observer,
		ours: map[redis.Cmder]bool{}, result: map[redis.Cmder]error{}}
	return context.WithValue(ctx, waitKey{}, r), r
}

// confirmed reports whether cmd's wait confirmed it: nil, or an error
// wrapping ErrNotReplicated. With no request (no waiting) all is confirmed.
func (r *waitReq) confirmed(cmd redis.Cmder) error {
	if r == nil {
		return nil
	}
	if r.skipped {
		return errNotWaited
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	err, ok := r.result[cmd]
	if !ok {
		// Sent on a connection without the hook: nothing confirmed it.
		return fmt.Errorf("%w (no wait ran after it)", ErrNotReplicated)
	}
	return err
}

// waitFrom is the request ctx carries, nil for none.
func waitFrom(ctx context.Context) *waitReq {
	r, _ := ctx.Value(waitKey{}).(*waitReq)
	return r
}

// installWait puts the hook on the client, or under Cluster on every node
// client go-redis creates. A node client made before New (a cluster client
// used before it was given to the store) lacks it, and its calls then
// count as not confirmed: never as confirmed.
func (s *Store) installWait() {
	if !s.wait.on() {
		return
	}
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(waitHook{}) })
	case *redis.Client:
		c.AddHook(waitHook{})
	}
}

// waitHook appends the wait to the commands of one connection.
type waitHook struct{}

func (waitHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (waitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (waitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if r := waitFrom(ctx); r != nil {
			return r.process(ctx, cmds, next)
		}
		return next(ctx, cmds)
	}
}

// process runs cmds followed by the wait, on one connection, and records the
// outcome for each of them.
func (r *waitReq) process(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
	calls := make([]redis.Cmder, 0, len(cmds))
	scripts := false
	r.mu.Lock()
	for _, c := range cmds {
		// A retry (MOVED, a broken connection) hands back the commands of
		// an earlier wait too: they are not sent again.
		if !r.ours[c] {
			calls = append(calls, c)
			scripts = scripts || c.Name() == "fcall" || c.Name() == "evalsha" || c.Name() == "eval"
		}
	}
	r.mu.Unlock()
	if len(calls) == 0 {
		return nil
	}
	if !scripts {
		// go-redis' own pipeline on a new connection (HELLO, CLIENT
		// SETINFO), run with the caller's context.
		return next(ctx, calls)
	}
	ms := max(r.timeout.Milliseconds(), 1)
	before, after := redis.NewTimeCmd(ctx, "time"), redis.NewTimeCmd(ctx, "time")
	var wait *redis.IntCmd
	var aof *redis.IntSliceCmd
	sent := append(calls, before)
	if r.replicas > 0 {
		wait = redis.NewIntCmd(ctx, "wait", r.replicas, ms)
		sent = append(sent, wait)
	}
	if r.fsync {
		aof = redis.NewIntSliceCmd(ctx, "waitaof", 1, 0, ms)
		sent = append(sent, aof)
	}
	sent = append(sent, after)
	r.mu.Lock()
	for _, c := range sent[len(calls):] {
		r.ours[c] = true
	}
	r.mu.Unlock()
	start := time.Now()
	err := next(ctx, sent)

	var short error
	switch {
	case wait != nil && wait.Err() != nil:
		short = fmt.Errorf("%w: WAIT: %v", ErrNotReplicated, wait.Err())
	case wait != nil && wait.Val() < int64(r.replicas):
		short = fmt.Errorf("%w: %d of %d replicas within %dms", ErrNotReplicated, wait.Val(), r.replicas, ms)
	case aof != nil && aof.Err() != nil:
		short = fmt.Errorf("%w: WAITAOF: %v", ErrNotReplicated, aof.Err())
	case aof != nil && (len(aof.Val()) < 1 || aof.Val()[0] < 1):
		short = fmt.Errorf("%w: the master did not fsync within %dms", ErrNotReplicated, ms)
	}
	took := time.Since(start)
	if before.Err() == nil && after.Err() == nil {
		took = after.Val().Sub(before.Val())
	}
	if r.obs != nil {
		r.obs.Waited(r.op, took, short != nil)
	}
	r.mu.Lock()
	for _, c := range calls {
		// The last wait a call went through is the one of the node it ran
		// on: a redirected call goes through the hook again, later.
		r.result[c] = short
	}
	r.mu.Unlock()
	return err
}

// probed notes whether the wait of a pipeline of op (which probes) fell
// short, which sets its next pipelines' (claimProbe).
func (s *Store) probed(op string, r *waitReq, short bool) {
	p := s.probing[op]
	if r == nil || r.skipped || p == nil {
		return
	}
	if short && !p.short.Load() {
		p.lastProbe.Store(time.Now().UnixNano())
	}
	p.short.Store(short)
}

// CheckWait checks, at start, that Redis can do what the wait options ask:
// WAITAOF (Redis 7.2 or newer, appendonly yes on the master) for
// wait_local_fsync. It returns the fewest replicas connected to any master,
// for a warning when that is below wait_replicas (schedules then get 504
// until they are back). An error that is no refusal (Redis unreachable) is
// returned as it is; the caller may go on, as the waits themselves fail safe.
func (s *Store) CheckWait(ctx context.Context) (replicas int, err error) {
	if !s.wait.on() {
		return 0, nil
	}
	replicas = -1
	check := func(ctx context.Context, c *redis.Client) error {
		var version string
		var n int
		info, err := c.Info(ctx, "server", "replication").Result()
		switch {
		case err == nil:
			version = infoField(info, "redis_version")
			n, _ = strconv.Atoi(infoField(info, "connected_slaves"))
		case redis.HasErrorPrefix(err, "NOPERM"):
			// The ACL of docs/security.md refuses INFO (@dangerous): count the
			// replicas with a WAIT that waits for nothing, and probe
			// WAITAOF below all the same.
			version = "(INFO not permitted)"
			if n, err = c.Do(ctx, "wait", 0, 0).Int(); err != nil {
				return fmt.Errorf("store: count replicas: %w", err)
			}
		default:
			return fmt.Errorf("store: read INFO: %w", err)
		}
		if replicas < 0 || n < replicas {
			replicas = n
		}
		if !s.wait.LocalFsync {
			return nil
		}
		// A probe that waits for nothing: WAITAOF 0 0 answers at once.
		if err := c.Do(ctx, "waitaof", 0, 0, 1).Err(); err != nil {
			if isUnknownCommand(err) {
				return fmt.Errorf("%w: redis.wait_local_fsync needs WAITAOF, which Redis %s at %s does not have (Redis 7.2 or newer has it); "+
					"upgrade Redis or set redis.wait_local_fsync: false", ErrWaitUnsupported, version, c.Options().Addr)
			}
			return fmt.Errorf("store: WAITAOF probe: %w", err)
		}
		if err := c.Do(ctx, "waitaof", 1, 0, 1).Err(); err != nil {
			var re redis.Error
			if asRedisError(err, &re) {
				return fmt.Errorf("%w: redis.wait_local_fsync needs appendonly yes on the master %s: %v", ErrWaitUnsupported, c.Options().Addr, err)
			}
			return fmt.Errorf("store: WAITAOF probe: %w", err)
		}
		return nil
	}
	var mu sync.Mutex
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return check(ctx, n)
		})
	case *redis.Client:
		err = check(ctx, c)
	default:
		return 0, fmt.Errorf("store: wait: unsupported client %T", s.rdb)
	}
	return max(replicas, 0), err
}

// ErrWaitUnsupported: the Redis deployment cannot do what the wait
// settings ask for; the daemon refuses to start.
var ErrWaitUnsupported = errors.New("redis cannot confirm writes as configured")

func isUnknownCommand(err error) bool {
	var re redis.Error
	return asRedisError(err, &re) && strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
