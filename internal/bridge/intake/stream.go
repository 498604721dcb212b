package intake

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/store"
)

// StreamStore is what the stream intake needs from the delay set.
type StreamStore interface {
	Schedule(ctx context.Context, items []store.Item) ([]store.Scheduled, []error)
	Shard(id string) int
	// IntakeFloor and SaveIntakeFloor keep the stream's floor
	// (stream_floor.go).
	IntakeFloor(ctx context.Context, name string, createdNs int64) (uint64, error)
	SaveIntakeFloor(ctx context.Context, name string, createdNs int64, floor uint64) error
}

// StreamObserver counts stream intake outcomes for metrics.
type StreamObserver interface {
	// StreamIntake counts n messages taken from the stream by result:
	// stored, bad_request, forbidden, too_large or unavailable (left in
	// the stream to be offered again).
	StreamIntake(result string, n int)
	RedisError(op string)
}

// StreamOptions configure the durable stream intake.
type StreamOptions struct {
	Options
	// Name is the stream's and the shared durable consumer's name.
	Name string
	// Required makes a server without JetStream an error; otherwise the
	// stream intake waits for JetStream with a warning.
	Required bool
	Replicas int
	// WorkQueue creates the stream with work-queue retention (each ack
	// deletes its message) instead of limits retention purged below the
	// ack floor (stream_floor.go). A stream that exists is bound as it is.
	WorkQueue bool
	MaxAge    time.Duration
	MaxBytes  int64
	// Pull is how many messages this daemon keeps requested.
	Pull int
	// PullBytes bounds the bytes of stream messages the NATS client
	// buffers for this daemon, and again those it holds taken and not yet
	// acknowledged (0: only Pull bounds them). It is raised to the largest
	// valid envelope, so that one always fits.
	PullBytes int64
	AckWait   time.Duration
	// RetryDelay is the Nak delay of a message Redis did not store.
	RetryDelay time.Duration
	// afterStep, in tests, is called after each step of a migration
	// (MigrateIntake).
	afterStep func(step string)
	// lockStale, in tests, replaces lockStale; unlocked runs a migration
	// without the lock, as a run whose lock was taken over while it still
	// ran does (stream_migrate_lock.go).
	lockStale time.Duration
	unlocked  bool
}

// pullSize is how much the consumer keeps requested: Pull messages, and
// at most PullBytes of them when that is set, raised to the largest
// message the stream can hold: a pull's byte bound below its head message
// stalls the consumer for good (the server answers every pull "Message
// Size Exceeds MaxBytes", and the message never comes). That is the
// server's max_payload (the limit a publish into the stream had), or
// limits.max_payload if larger, plus the headers; asked at each (re)start
// of the consumer, once connected.
func (s *StreamIntake) pullSize() jetstream.PullConsumeOpt {
	if s.opt.PullBytes <= 0 {
		return jetstream.PullMaxMessages(s.opt.Pull)
	}
	limit := max(s.opt.PullBytes, largestMessage(s.nc, s.opt.Limits))
	s.held.setLimit(limit)
	return jetstream.PullMaxMessagesWithBytesLimit(s.opt.Pull, int(limit))
}

// intakeSubject is the subject publishers publish durable envelopes to
// (and <prefix>.intake.> below it).
func intakeSubject(prefix string) string { return prefix + ".intake" }

// rejectedSubject is where invalid stream envelopes are published.
func rejectedSubject(prefix string) string { return prefix + ".rejected" }

// errStreamClash means a stream of the configured name exists and does
// not capture delayd's intake subjects: likely another deployment's.
var errStreamClash = errors.New("stream does not capture the intake subjects")

// StreamIntake takes envelopes from the JetStream intake stream, stores
// them in Redis, and acknowledges each only after Redis confirmed it.
type StreamIntake struct {
	core[StreamStore]
	nc  *nats.Conn
	obs StreamObserver
	opt StreamOptions
	// idPrefix makes the id of an envelope without Delayd-Id from the
	// stream's creation time and the message's sequence: the same on
	// every redelivery, so a redelivery replaces, and never the same for
	// a stream deleted and created again.
	idPrefix atomic.Value // string; set up again if the stream is re-created while handlers run
	// bound is the consumer taken from, for the floor (stream_floor.go);
	// settled says messages were settled since the floor was last saved.
	bound       atomic.Pointer[boundConsumer]
	settled     atomic.Bool
	floorWarned atomic.Pointer[string] // the last floor error warned about
	purgeWarned atomic.Pointer[string] // the last purge error warned about
}

// nopStreamObserver is the observer of a stream intake built without one.
type nopStreamObserver struct{}

func (nopStreamObserver) StreamIntake(string, int) {}
func (nopStreamObserver) RedisError(string)        {}

// NewStreamIntake builds the stream intake on its own connection nc, which
// it closes when it stops. A nil obs counts nothing.
func NewStreamIntake(nc *nats.Conn, st StreamStore, w Waker, obs StreamObserver, opt StreamOptions, log hclog.Logger) *StreamIntake {
	if obs == nil {
		obs = nopStreamObserver{}
	}
	opt.Options = opt.Options.filled()
	if opt.Batch < 1 {
		opt.Batch = 256
	}
	if opt.Pull < 1 {
		opt.Pull = 1024
	}
	s := &StreamIntake{core: core[StreamStore]{store: st, waker: w, log: log, check: opt.validator(nc), queue: make(chan item, 2*opt.Pull),
		held:    newHeldBytes(opt.PullBytes, "stream intake", "intake.stream.pull_bytes", log, opt.Now),
		timeout: opt.storeTimeout, now: opt.Now}, nc: nc, obs: obs, opt: opt}
	s.tally = s.countFlush
	return s
}

// HeldBytes is how many bytes of stream messages the intake holds now,
// taken and not yet settled (intake.stream.pull_bytes bounds it): 0 when
// it is idle.
func (s *StreamIntake) HeldBytes() int64 { return s.held.bytes() }

// Run sets the stream and consumer up (retrying while NATS or JetStream is
// away), then takes envelopes until ctx is done. On shutdown it stops
// pulling, stores and acknowledges what it already took, and returns.
func (s *StreamIntake) Run(ctx context.Context) error {
	defer s.nc.Close()
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("bridge: jetstream: %w", err)
	}
	cons, err := s.setupRetrying(ctx, js)
	if err != nil || cons == nil {
		return err
	}

	drained := pipeline(s.queue, s.opt.Batch, 0, s.flush)
	floorCtx, stopFloor := context.WithCancel(context.Background())
	floorDone := make(chan struct{})
	go func() { defer close(floorDone); s.keepFloor(floorCtx) }()
	defer func() {
		// After the last acks: the floor they reached is saved too.
		stopFloor()
		<-floorDone
		if s.settled.Load() {
			s.saveFloor(context.Background())
		}
	}()
	for {
		lost := make(chan error, 1)
		cc, err := cons.Consume(s.handle, s.pullSize(),
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				// Deleted while connected (409, 404), or while away: then the
				// pulls after the reconnect find no responder. Setting up
				// again is harmless when the consumer is in fact there.
				if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
					errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrNoResponders) {
					select {
					case lost <- err:
					default:
					}
					return
				}
				if strings.Contains(err.Error(), "Exceeds MaxBytes") {
					// Cannot happen with pullSize's bound; if it does, the
					// head message is stuck: say so.
					s.log.Warn("the intake stream holds a message larger than a pull may take (intake.stream.pull_bytes)", "error", err)
					return
				}
				s.log.Debug("stream consumer", "error", err)
			}))
		if err != nil {
			s.gate.close(func() { close(s.queue) })
			drained()
			return fmt.Errorf("bridge: consume %s: %w", s.boundName(), err)
		}
		s.log.Info("stream intake serving", "stream", s.boundName(), "subjects", intakeSubject(s.opt.Subject)+", "+intakeSubject(s.opt.Subject)+".>")
		select {
		case err := <-lost:
			// The stream or its consumer was deleted behind delayd's back:
			// set them up again rather than stop taking envelopes quietly.
			s.log.Warn("intake stream or consumer gone; setting it up again", "stream", s.boundName(), "error", err)
			cc.Stop()
			// Give the server a moment to finish the deletion: a stream
			// created again while the old one is still being removed can
			// lose its first messages.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			if cons, err = s.setupRetrying(ctx, js); err != nil || cons == nil {
				s.gate.close(func() { close(s.queue) })
				drained()
				return err
			}
			continue
		case <-ctx.Done():
		}
		// Drain: no more pulls; the handler still runs for every message
		// already received. Closed is closed after the last one.
		cc.Drain()
		select {
		case <-cc.Closed():
		case <-time.After(s.opt.storeTimeout):
			s.log.Warn("stream consumer did not drain in time; what it holds is offered again after ack_wait")
			cc.Stop()
		}
		break
	}
	s.gate.close(func() { close(s.queue) })
	drained()
	fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = s.nc.FlushWithContext(fctx) // the last acks
	cancel()
	s.log.Info("stream intake stopped")
	return nil
}

// setupRetrying sets the stream up until it works, ctx ends (nil, nil), or
// a fault no retry can mend: a name clash, or no JetStream when required.
func (s *StreamIntake) setupRetrying(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	backoff := 100 * time.Millisecond
	warned := ""
	for {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cons, err := s.setup(sctx, js)
		cancel()
		if err == nil {
			return cons, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		noJS := errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)
		switch {
		case errors.Is(err, errStreamClash):
			return nil, err
		case noJS && s.opt.Required:
			return nil, fmt.Errorf("bridge: intake.stream.enabled is true but the NATS server has no JetStream: %w", err)
		case noJS:
			if warned != "nojs" {
				s.log.Warn("the NATS server has no JetStream: the durable stream intake is off until it has (the request intake works)",
					"subject", intakeSubject(s.opt.Subject))
				warned = "nojs"
			}
			backoff = 30 * time.Second
		default:
			if msg := err.Error(); warned != msg {
				s.log.Warn("stream intake not set up yet, retrying", "stream", s.opt.Name, "error", err)
				warned = msg
			}
			backoff = min(2*backoff, 5*time.Second)
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(backoff):
		}
	}
}

// setup binds the stream to take from (bindable: the configured one, or
// half-way through a migration the one to drain or the one between),
// creating the configured one when there is none, and creates or updates
// the durable consumer every daemon shares. An existing stream is bound as
// it is (it may be managed by an operator).
func (s *StreamIntake) setup(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	if _, err := js.AccountInfo(ctx); err != nil {
		return nil, err
	}
	st, err := s.bindable(ctx, js)
	if err == nil && st == nil {
		st, err = js.CreateStream(ctx, streamConfigOf(s.opt, s.opt.Name))
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another daemon was first
			st, err = js.Stream(ctx, s.opt.Name)
		} else if err == nil {
			s.log.Info("created the intake stream", "stream", s.opt.Name, "replicas", s.opt.Replicas)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bridge: stream %s: %w", s.opt.Name, err)
	}
	info := st.CachedInfo()
	name := info.Config.Name
	parked := roleOf(info, s.opt.Subject) == roleParked
	if !parked && !holds(info, s.opt.Subject) {
		return nil, fmt.Errorf("bridge: stream %s captures %v, not %s and %[3]s.>: %w (set intake.stream.name)",
			name, info.Config.Subjects, intakeSubject(s.opt.Subject), errStreamClash)
	}
	if parked {
		s.log.Info("draining an intake stream a migration took the subjects off (delayd intake migrate deletes it once it is empty)",
			"stream", name)
	}
	purged := info.Config.Retention == jetstream.LimitsPolicy && info.Config.Metadata[layoutKey] == layoutPurged
	if info.Config.Retention != jetstream.WorkQueuePolicy && !purged {
		s.log.Warn("the intake stream was not created by delayd: stored envelopes stay in it after delayd acknowledged them, and delayd never purges it",
			"stream", name, "retention", info.Config.Retention.String())
	}
	s.idPrefix.Store("s-" + strconv.FormatInt(info.Created.UnixNano(), 36) + "-")
	cfg := jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "delayd: stores intake envelopes in Redis",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.opt.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: max(16*s.opt.Pull, 20000),
	}
	if err := s.startAfterFloor(ctx, st, info, &cfg); err != nil {
		return nil, fmt.Errorf("bridge: consumer %s: %w", name, err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bridge: consumer %s: %w", name, err)
	}
	b := &boundConsumer{cons: cons, name: name, created: info.Created.UnixNano()}
	if purged {
		b.stream = st
	}
	s.bound.Store(b)
	return cons, nil
}

// streamConfigOf is the config of the stream delayd creates under name
// (opt.Name, or the one between of a migration).
func streamConfigOf(opt StreamOptions, name string) jetstream.StreamConfig {
	maxBytes := opt.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	retention, meta := jetstream.LimitsPolicy, map[string]string{layoutKey: layoutPurged}
	if opt.WorkQueue {
		retention, meta = jetstream.WorkQueuePolicy, nil
	}
	return jetstream.StreamConfig{
		Name:        name,
		Description: "delayd intake: envelopes waiting to be stored in Redis",
		Subjects:    []string{intakeSubject(opt.Subject), intakeSubject(opt.Subject) + ".>"},
		Retention:   retention,
		Metadata:    meta,
		Storage:     jetstream.FileStorage,
		Replicas:    opt.Replicas,
		MaxAge:      opt.MaxAge,
		MaxBytes:    maxBytes,
		// A full stream refuses new publishes (the publisher sees the
		// error) rather than dropping envelopes it already acknowledged.
		Discard: jetstream.DiscardNew,
	}
}
