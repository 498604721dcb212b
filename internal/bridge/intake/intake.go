package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/ratelog"
	"github.com/delayd/delayd/internal/store"
)

// Store is what the intake needs from the delay set.
type Store interface {
	Schedule(ctx context.Context, items []store.Item) ([]store.Scheduled, []error)
	Cancel(ctx context.Context, id string) (store.Cancelled, error)
	Shard(id string) int
}

// Waker is told the due time of each stored envelope so the scanner can
// wake early for it.
type Waker interface {
	Wake(shard int, dueMs int64)
}

// IntakeObserver counts intake outcomes for metrics.
type IntakeObserver interface {
	// Received counts a schedule request by its code (0 = stored).
	Received(code int)
	// Replied observes a schedule request that reached Redis, from
	// receipt to reply.
	Replied(took time.Duration)
	// Cancelled counts a cancel request: cancelled, not_found,
	// bad_request or unavailable.
	Cancelled(result string)
	// Redelivered counts envelopes replayed from the dead set.
	Redelivered(cause string, n int)
	RedisError(op string)
}

// Options are what both intakes take alike; the daemon fills them once.
type Options struct {
	// Subject is delayd's prefix: publishers use <Subject>.schedule,
	// <Subject>.cancel and <Subject>.intake(.>), operators
	// <Subject>.admin.*; stream rejects go to <Subject>.rejected.
	Subject string
	// Batch bounds one Redis pipeline.
	Batch int
	// MaxBatch bounds the envelopes of one batch request or message
	// (intake.max_batch; 0: DefaultMaxBatch). A larger batch is refused
	// whole.
	MaxBatch int
	Limits   envelope.Limits
	Policy   envelope.Policy
	// JetStream are the target patterns delivered with JetStream (their
	// deliveries carry a Nats-Msg-Id, which counts against max_payload).
	JetStream []string
	// Resends: delivered requests are remembered by the store
	// (intake.dedupe_window), so a one-shot with a publisher's id carries
	// its request's fingerprint, and a resend is answered, not stored.
	Resends bool
	// Now is the local clock, used only for the coarse limit checks on
	// Delayd-At and to time a request from receipt to reply; due times are
	// Redis time. Injected so tests can skew it.
	Now func() time.Time
	// storeTimeout bounds one Redis pipeline; past it callers get 504.
	storeTimeout time.Duration
}

// filled is o with its defaults set.
func (o Options) filled() Options {
	if o.storeTimeout == 0 {
		o.storeTimeout = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxBatch < 1 {
		o.MaxBatch = DefaultMaxBatch
	}
	return o
}

// validator is the check both intakes make of an envelope, on nc.
func (o Options) validator(nc *nats.Conn) validator {
	return validator{nc: nc, limits: o.Limits, policy: o.Policy, jetStream: o.JetStream, now: o.Now, resends: o.Resends}
}

// IntakeOptions configure the service.
type IntakeOptions struct {
	Options
	Version string
	Linger  time.Duration
	// RedactHeaders are headers whose values the get endpoint never returns.
	RedactHeaders []string
	// PendingBytes bounds the bytes of schedule requests taken but not yet
	// answered, and of those waiting in the NATS client for the handler
	// (0: no bound).
	PendingBytes int64
	// Flow makes the operator's flow-control changes (endpoints limit,
	// limits, pause, resume; stats lists the rules).
	Flow FlowControl
	// trace, when set (by the latency-budget benchmark), is told when each
	// schedule request reached each stage inside delayd: "handler",
	// "queued", "flush" (its batch's Redis call starts), "stored" and
	// "replied".
	trace func(id, stage string, at time.Time)
}

// unknownReply is the body of a 504 answer: the outcome is unknown, and a
// retry with this id (as Delayd-Id) replaces rather than duplicates.
type unknownReply struct {
	ID string `json:"id"`
}

// codeOutcomeUnknown answers a request whose write may or may not have
// happened (Redis timed out after the request was sent).
const codeOutcomeUnknown = 504

// Intake is the delayd micro service.
type Intake struct {
	core[Store]
	// nc carries the service subscriptions and the replies. Replies must go
	// out on the connection that received the request: NATS grants a user
	// with allow_responses permission to publish to a reply subject only on
	// that connection.
	nc   *nats.Conn
	insp Inspector
	obs  IntakeObserver
	opt  IntakeOptions
	// shortLog limits the warning about writes the replicas did not
	// confirm to one line per shortLogEvery.
	shortLog *ratelog.Limiter
	// late counts the error replies micro cannot see (answer).
	late lateErrors
}

// nopIntakeObserver is the observer of an intake built without one.
type nopIntakeObserver struct{}

func (nopIntakeObserver) Received(int)            {}
func (nopIntakeObserver) Replied(time.Duration)   {}
func (nopIntakeObserver) Cancelled(string)        {}
func (nopIntakeObserver) Redelivered(string, int) {}
func (nopIntakeObserver) RedisError(string)       {}

// NewIntake builds the service on its own connection nc, which it closes
// when it stops. A nil obs counts nothing.
func NewIntake(nc *nats.Conn, st Store, insp Inspector, w Waker, obs IntakeObserver, opt IntakeOptions, log hclog.Logger) *Intake {
	if obs == nil {
		obs = nopIntakeObserver{}
	}
	opt.Options = opt.Options.filled()
	in := &Intake{core: core[Store]{store: st, waker: w, log: log, check: opt.validator(nc), queue: make(chan item, 4*opt.Batch),
		held:    newHeldBytes(opt.PendingBytes, "request intake", "intake.pending_bytes", log, opt.Now),
		timeout: opt.storeTimeout, maxWait: opt.storeTimeout, now: opt.Now, trace: opt.trace},
		nc: nc, insp: insp, obs: obs, opt: opt, shortLog: ratelog.New(shortLogEvery, opt.Now)}
	in.tally = in.countFlush
	return in
}

// HeldBytes is how many bytes of schedule requests the intake holds now,
// taken and not yet answered (intake.pending_bytes bounds it): 0 when it
// is idle.
func (in *Intake) HeldBytes() int64 { return in.held.bytes() }

// adminSubject is the prefix of the operator endpoints (get, list, stats,
// replay, purge): <prefix>.admin.
func adminSubject(prefix string) string { return prefix + ".admin" }

// Run serves until ctx is done, then stops taking requests, stores and
// answers every request already taken, and returns.
func (in *Intake) Run(ctx context.Context) error {
	svc, err := micro.AddService(in.nc, micro.Config{
		Name:        "delayd",
		Version:     bridge.ServiceVersion(in.opt.Version),
		Description: "Delayed delivery of NATS messages",
		QueueGroup:  "delayd",
		// A schedule's Redis outcome (503, 504) is answered after its
		// handler returned, where micro's num_errors cannot count it.
		StatsHandler: func(e *micro.Endpoint) any {
			if e.Name == "schedule" {
				return in.late.stats()
			}
			return nil
		},
	})
	if err != nil {
		return fmt.Errorf("bridge: add service: %w", err)
	}
	g := svc.AddGroup(in.opt.Subject)
	var pend []micro.EndpointOpt
	if in.opt.PendingBytes > 0 {
		// Past this, the NATS client drops requests (the publisher times
		// out and retries) rather than buffer without bound. Never below
		// one request of the server's max_payload: the client would drop
		// that one every time, and its publisher retry forever.
		limit := max(in.opt.PendingBytes, largestMessage(in.nc, in.opt.Limits))
		pend = append(pend, micro.WithEndpointPendingLimits(-1, int(limit)))
	}
	if err := g.AddEndpoint("schedule", micro.HandlerFunc(in.handleSchedule), pend...); err != nil {
		return fmt.Errorf("bridge: add schedule endpoint: %w", err)
	}
	if err := g.AddEndpoint("cancel", micro.HandlerFunc(in.handleCancel)); err != nil {
		return fmt.Errorf("bridge: add cancel endpoint: %w", err)
	}
	// Operator endpoints live apart from the publisher's, so that NATS
	// permissions tell the two roles apart.
	admin := svc.AddGroup(adminSubject(in.opt.Subject))
	if err := in.addFlow(admin); err != nil {
		return err
	}
	if err := in.addInspect(admin); err != nil {
		return fmt.Errorf("bridge: add inspection endpoints: %w", err)
	}
	subjects := []any{"schedule", in.opt.Subject + ".schedule", "cancel", in.opt.Subject + ".cancel",
		"admin", adminSubject(in.opt.Subject) + ".>"}
	if in.nc.IsConnected() {
		in.log.Info("intake serving", subjects...)
	} else {
		// The subscriptions wait in the client until the connection is
		// up (the NATS connection logs that): nothing is served yet.
		in.log.Warn("intake set up, not serving until NATS is connected", subjects...)
	}

	drained := pipeline(in.queue, in.opt.Batch, in.opt.Linger, in.flush)

	<-ctx.Done()
	if err := svc.Stop(); err != nil {
		in.log.Warn("stopping service", "error", err)
	}
	// Stop drains the service's subscriptions: the handlers still run for
	// every message already received. Only when the last subscription is
	// gone is it safe to close the queue they write to. The connection
	// stays open for the replies of what was taken in.
	for wait := time.Now().Add(5 * time.Second); in.nc.NumSubscriptions() > 0 && !in.nc.IsClosed() && time.Now().Before(wait); {
		time.Sleep(5 * time.Millisecond)
	}
	in.gate.close(func() { close(in.queue) })
	drained()
	fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = in.nc.FlushWithContext(fctx)
	cancel()
	in.nc.Close()
	in.log.Info("intake stopped")
	return nil
}

// singleReply answers a single request.
type singleReply struct{ in *Intake }

func (r singleReply) settle(it *item) {
	if it.out.err != nil {
		r.in.storeFailed(later(it.reply), it.ID, it.out.err)
		return
	}
	if it.reply != "" {
		if err := r.in.nc.Publish(it.reply, result(it)); err != nil {
			r.in.log.Warn("reply failed", "error", err)
		}
	}
}

func (r singleReply) settled(it *item) {
	if r.in.trace != nil && it.out.err == nil {
		r.in.trace(it.ID, "replied", time.Now())
	}
	r.in.replied(it.start)
	r.in.held.release(it.bytes)
}

// countFlush counts every outcome of a flush and logs its failures: a write
// the replicas did not confirm at most every shortLogEvery, others once.
func (in *Intake) countFlush(batch []item) {
	logged := false
	for i := range batch {
		o := batch[i].out
		switch {
		case o.err == nil:
			if o.Kind == store.Resend {
				// A resend of a request delivered already: answered with
				// the due time it had, nothing stored.
				in.resent(batch[i].ID)
			}
			in.count(0)
			continue
		case errors.Is(o.err, store.ErrNotReplicated):
			in.notReplicated(o.err)
		case !errors.Is(o.err, errStale) && !logged:
			in.log.Error("storing envelopes failed", "count", len(batch), "error", o.err)
			in.redisError(store.OpSchedule)
			logged = true
		}
		in.count(failedCode(o.err))
	}
}

// failedCode is what a request whose write failed with err is answered:
// 503 when nothing was written, so a retry cannot duplicate; 504 when the
// write may have happened.
func failedCode(err error) int {
	if errors.Is(err, store.ErrNotWritten) {
		return envelope.CodeUnavailable
	}
	return codeOutcomeUnknown
}

// storeFailed answers a request whose write failed with failedCode: 504
// with the id, so a retry with that id replaces what may be stored.
func (in *Intake) storeFailed(reply answer, id string, err error) {
	code, msg, body := storeFailure(id, err)
	in.failWith(reply, code, msg, body)
}

// storeFailure is the answer to a write of id that failed with err: its
// code, message and body (the id, for a 504).
func storeFailure(id string, err error) (int, string, []byte) {
	switch {
	case errors.Is(err, errStale):
		return envelope.CodeUnavailable, staleMsg, nil
	case failedCode(err) == envelope.CodeUnavailable:
		return envelope.CodeUnavailable, "store unavailable, nothing stored", nil
	}
	b, _ := json.Marshal(unknownReply{ID: id})
	msg := "store timed out: the envelope may or may not be stored; retry with Delayd-Id " + id
	if errors.Is(err, store.ErrNotReplicated) {
		msg = notReplicatedMsg + id
	}
	return codeOutcomeUnknown, msg, b
}

// The store's answers that do not depend on the request (but for the id
// the longest ends with): worstResult sizes a batch's reply with them.
const (
	staleMsg         = "store unavailable: waited too long for Redis, nothing stored"
	notReplicatedMsg = "not confirmed by the Redis replicas redis.wait_replicas asks for: written on the master, but a failover may lose it; retry with Delayd-Id "
)

// shortLogEvery is the least time between two warnings that requests get
// 504 because the replicas did not confirm their writes.
const shortLogEvery = 5 * time.Second

// notReplicated warns, at most every shortLogEvery, that requests get 504
// because the replicas did not confirm their writes.
func (in *Intake) notReplicated(err error) {
	if ok, _ := in.shortLog.Note(1); !ok {
		return
	}
	in.log.Warn("requests answered 504: the Redis replicas did not confirm their writes (redis.wait_replicas); "+
		"they are on the master and will be delivered unless it fails over first", "error", err)
}

func (in *Intake) handleSchedule(req micro.Request) {
	h := requestHeaders(req.Headers())
	if _, ok := envelope.IsBatch(h); ok {
		in.handleBatch(req, h)
		return
	}
	start := in.opt.Now()
	it, err := in.check.item(h, req.Data(), func() (string, error) { return nuid.Next(), nil })
	if err != nil {
		in.count(envelope.CodeOf(err))
		in.reject(now(req), err)
		return
	}
	if in.trace != nil {
		in.trace(it.ID, "handler", start)
	}
	n := requestBytes(req.Data(), req.Headers())
	if !in.take(nil, n, item{Item: it, to: singleReply{in}, reply: req.Reply(), start: start, bytes: n}) {
		in.count(envelope.CodeUnavailable)
		in.reject(now(req), &envelope.Error{Code: envelope.CodeUnavailable, Msg: "delayd is stopping: nothing stored, retry"})
	}
}

func (in *Intake) handleCancel(req micro.Request) {
	id, err := envelope.ParseID(req.Headers(), in.opt.Limits)
	if err != nil {
		in.cancelled("bad_request")
		in.reject(now(req), err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), in.opt.storeTimeout)
	c, err := in.store.Cancel(ctx, id)
	cancel()
	if err != nil {
		if errors.Is(err, store.ErrNotReplicated) {
			in.notReplicated(err)
		} else {
			in.log.Error("cancel failed", "id", id, "error", err)
			in.redisError(store.OpCancel)
		}
		// Counted before the reply, like every outcome.
		if failedCode(err) == codeOutcomeUnknown {
			in.cancelled("outcome_unknown")
		} else {
			in.cancelled("unavailable")
		}
		in.storeFailed(now(req), id, err)
		return
	}
	if c.Existed {
		in.cancelled("cancelled")
	} else {
		in.cancelled("not_found")
	}
	in.respond(now(req), client.Cancelled{ID: id, Cancelled: c.Existed, InFlight: c.InFlight})
}

func (in *Intake) redisError(op string) {
	in.obs.RedisError(op)
}

func (in *Intake) replied(start time.Time) {
	in.obs.Replied(in.opt.Now().Sub(start))
}

func (in *Intake) cancelled(result string) {
	in.obs.Cancelled(result)
}

func (in *Intake) count(code int) {
	in.obs.Received(code)
}

// resent logs a resend of a delivered request, answered without storing.
func (in *Intake) resent(id string) {
	in.log.Debug("a resend of a request delivered already: answered with its due time, not stored again", "id", id)
}
