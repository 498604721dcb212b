package store

// The store's write contract, in one declaration: every operation that
// runs a script, and its policy with redis.wait_replicas (and
// wait_local_fsync). exec, below, runs every script call of the store and
// reads this table: an operation names itself and gets each call's
// result classified and confirmed as its policy says, so none can forget
// its wait or ask for one of its own. ops_test.go fails on an operation
// or a script that is not in the table, and on a script call made
// anywhere but here.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// The operations the store's callers name in their metrics and logs
// (delayd_redis_errors_total{op}) and that WaitObserver reports: one name
// each, so a metric's label list cannot drift from its call sites.
const (
	OpSchedule = "schedule"
	OpCancel   = "cancel"
	OpClaim    = "claim"
	OpAck      = "ack"
)

// The other operations that write: no metric names them.
const (
	purgeOp       = "purge"
	replayOp      = "replay"
	checkOp       = "check"
	heartbeatOp   = "heartbeat"
	formatsOp     = "formats"
	ownOp         = "own"
	intakeFloorOp = "intake_floor"
	reserveOp     = "reserve"
	releaseOp     = "release"
)

// waitMode is how an operation's writes wait for the replicas when the store
// waits (WithWait; wait.go).
type waitMode int

const (
	// neverWaits: its writes count once the master answered.
	neverWaits waitMode = iota
	// waitsFully: each pipeline ends with a WAIT of the whole
	// redis.wait_timeout; a call it does not confirm fails with
	// ErrNotReplicated.
	waitsFully
	// probes: as waitsFully until a wait falls short; then its pipelines
	// do not wait (their calls are unconfirmed), except one probe every
	// claimProbeEvery that waits up to claimProbe, until a probe is
	// confirmed (wait.go).
	probes
)

func (w waitMode) String() string {
	return [...]string{"never waits", "waits fully", "probes"}[w]
}

// policy is one operation's write contract.
type policy struct {
	// scripts are the scripts it runs.
	scripts []*script
	wait    waitMode
	// fenced: a call that may write nothing (call.fence) ends its
	// pipeline with a fence, which its wait then covers (wait.go). Without
	// it, such a call would be confirmed by an older write of its pooled
	// connection.
	fenced bool
	// why the operation needs no more and no less.
	why string
}

// policies is the write contract, by operation. The reasons are the
// promises of docs/protocol.md and docs/operations.md ("Redis failover and
// redis.wait_replicas").
var policies = map[string]policy{
	OpSchedule: {scripts: []*script{scheduleScript}, wait: waitsFully, fenced: true,
		why: "a 200 reply or a stream ack says the envelope is stored: with wait_replicas, on that many replicas, " +
			"and a 504 with its id when they do not confirm. A stream message stored already, or a resend of a " +
			"delivered request, is answered without a write: fenced, so its wait covers the earlier write it stands for."},
	OpCancel: {scripts: []*script{cancelScript}, wait: waitsFully, fenced: true,
		why: "a 200 says the envelope is gone: a cancel that a failover undoes delivers what the publisher " +
			"cancelled. A cancel of an id not stored (a retry after a 504) writes nothing: fenced."},
	OpClaim: {scripts: []*script{claimScript}, wait: probes,
		why: "a claim is confirmed before it is published, so a failover cannot bring back its attempt count; " +
			"but it is published even when short (a timer service that stops delivering is worse than a rare " +
			"repeat), so one missing replica must not add the whole timeout to every delivery: it probes. " +
			"A claim that hands out nothing publishes nothing: no fence."},
	OpAck: {scripts: []*script{ackScript}, wait: neverWaits,
		why: "a settle a failover loses leaves the lease to expire: the envelope is delivered again with a " +
			"higher attempt, a duplicate and never a loss; waiting would hold every delivery round."},
	purgeOp: {scripts: []*script{cancelScript}, wait: neverWaits,
		why: "an operator's removal of dead envelopes: one a failover brings back is dead still, and is purged again."},
	replayOp: {scripts: []*script{replayScript}, wait: neverWaits,
		why: "an operator's replay: one a failover undoes leaves the envelope dead, where it is seen and replayed again."},
	checkOp: {scripts: []*script{checkScript}, wait: neverWaits,
		why: "a repair a failover undoes is found again by the next check."},
	heartbeatOp: {scripts: []*script{heartbeatScript}, wait: neverWaits,
		why: "renewed every third of its TTL: a lost heartbeat is written again by the next."},
	formatsOp: {scripts: []*script{heartbeatScript}, wait: neverWaits,
		why: "renewed every third of its TTL: a lost announcement is written again by the next."},
	ownOp: {scripts: []*script{ownScript}, wait: neverWaits,
		why: "a shard lease, renewed every third of its TTL: a lost one lets two daemons claim one shard for a " +
			"while, which claims are safe against (one atomic script each, unique tokens)."},
	reserveOp: {scripts: []*script{reserveScript}, wait: neverWaits,
		why: "a slot a failover loses is given again: a held envelope claimed at its slot is then slotted anew, " +
			"later, never early; waiting would hold every delivery of a limited target."},
	releaseOp: {scripts: []*script{releaseScript}, wait: neverWaits,
		why: "an operator's resume or limit removal: envelopes a failover leaves held are released by running it again " +
			"(a daemon resumes a paused pattern's leftovers by itself)."},
	intakeFloorOp: {scripts: []*script{intakeFloorScript}, wait: neverWaits,
		why: "a lost floor makes a consumer created again start lower: the shards remember the stream messages " +
			"they stored, and store none twice."},
}

// WaitOps are the operations whose policy waits for the replicas (fully
// or probing), sorted: the ones WaitObserver can be told of, and the label
// values of the wait metrics.
func WaitOps() []string {
	var out []string
	for op, p := range policies {
		if p.wait != neverWaits {
			out = append(out, op)
		}
	}
	slices.Sort(out)
	return out
}

// scriptCall is one call of a script as its script_<name>.go builds it:
// the script, the call encoded, and its reply decoded.
type scriptCall[R any] interface {
	script() *script
	encode() call
	decode(*redis.Cmd) (R, error)
}

// result is one call's outcome, classified and confirmed.
type result[R any] struct {
	// reply is the decoded reply when ran.
	reply R
	// ran: the call ran, and its reply decoded.
	ran bool
	// err is nil when the call ran and its writes are confirmed as the
	// operation's policy asks (always, for one that never waits). Else,
	// for a call that did not run, why, wrapping ErrNotWritten or
	// ErrOutcomeUnknown; for one that ran, why its writes are not
	// confirmed, wrapping ErrNotReplicated.
	err error
	// emptyErr is err for a part of the reply that wrote nothing: only
	// the call's fence makes its wait cover that, so a failed fence leaves
	// such a part unconfirmed even when the wait was not short.
	emptyErr error
}

// errFor is the error of a part of the reply that wrote something, or
// nothing.
func (r result[R]) errFor(wrote bool) error {
	if wrote {
		return r.err
	}
	return r.emptyErr
}

// exec runs the calls of operation op in one pipeline, as op's policy
// asks, and returns each call's result, in order, and the error of the
// first call that did not run (nil when all ran). It is the only place
// that runs scripts (script.go sends them).
func exec[R any, A scriptCall[R]](ctx context.Context, s *Store, op string, args []A) ([]result[R], error) {
	p, ok := policies[op]
	if !ok {
		panic("store: operation " + op + " has no policy in ops.go")
	}
	if len(args) == 0 {
		return nil, nil
	}
	sc := args[0].script()
	if !slices.Contains(p.scripts, sc) {
		panic(fmt.Sprintf("store: operation %s runs %s.lua, which its policy in ops.go does not name", op, sc.name))
	}
	if sc.shard && s.gated && !s.schemaOK.Load() {
		err := errors.Join(ErrNotWritten, errSchemaUnchecked)
		out := make([]result[R], len(args))
		for i := range out {
			out[i].err, out[i].emptyErr = err, err
		}
		return out, err
	}
	ctx, req := s.waitCtx(ctx, op, p.wait)
	calls := make([]call, len(args))
	var fences []string
	for i, a := range args {
		calls[i] = a.encode()
		if f := calls[i].fence; req != nil && p.fenced && f != "" && !slices.Contains(fences, f) {
			fences = append(fences, f)
		}
	}
	fenceErrs := map[string]error{}
	cmds := s.send(ctx, sc, calls, fences, fenceErrs, true)
	out := make([]result[R], len(args))
	var first error
	ran, short := false, false
	for i, cmd := range cmds {
		r := &out[i]
		err := cmd.Err()
		if err == nil {
			r.reply, err = args[i].decode(cmd)
		} else if sc.shard {
			keys := calls[i].keys
			if calls[i].touches != nil {
				keys = calls[i].touches
			}
			err = s.nameWrongType(ctx, keys, err)
		}
		if err != nil {
			r.err = classify(err, s.cluster)
			r.emptyErr = r.err
			if first == nil {
				first = r.err
			}
			continue
		}
		r.ran, ran = true, true
		r.err = req.confirmed(cmd)
		short = short || r.err != nil
		r.emptyErr = r.err
		if f := calls[i].fence; r.err == nil && slices.Contains(fences, f) && fenceErrs[f] != nil {
			r.emptyErr = fmt.Errorf("%w: the fence before the wait failed: %v", ErrNotReplicated, fenceErrs[f])
		}
	}
	if ran && p.wait == probes {
		s.probed(op, req, short)
	}
	return out, first
}

// exec1 is exec of a single call.
func exec1[R any, A scriptCall[R]](ctx context.Context, s *Store, op string, a A) result[R] {
	out, _ := exec[R](ctx, s, op, []A{a})
	return out[0]
}
