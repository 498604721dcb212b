package daemon

import (
	"context"
	"time"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/bridge/intake"
	"github.com/delayd/delayd/internal/flow"
	"github.com/delayd/delayd/internal/scanner"
)

// newScanner builds the scanner with its wake relay (the scanner announces
// through the relay; the relay hands what it hears to the scanner when it
// runs), the inspector and shard ownership. Every mode has them: an intake
// wakes the scanner, or announces to the shard's owner.
func (p *parts) newScanner() {
	c := p.c
	opts := scanner.Options{
		ClaimBatch: c.Scanner.ClaimBatch, ClaimBytes: claimBytes(c, p.log), Lease: c.Scanner.Lease, IdleInterval: c.Scanner.IdleInterval,
		RetryBackoff: c.Scanner.RetryBackoff, RetryBackoffMax: c.Scanner.RetryBackoffMax,
		MaxAttempts: c.Scanner.MaxAttempts, NoInterestRetryFor: c.Scanner.NoInterestRetryFor, Shared: true,
		StrictClaims: c.Redis.WaitClaims == "strict", Acked: p.opt.acked,
	}
	if c.Dead.Publish {
		opts.DeadSubject = c.Subject + ".dead"
	}
	p.relay = bridge.NewWakeRelay(p.out, c.Subject, p.log.Named("wake"))
	opts.Announce = p.relay.Announce
	// Released envelopes are due now: every shard's owner claims at once.
	wakeAll := func() {
		for sh := range p.st.Shards() {
			p.sc.Wake(sh, 0)
		}
	}
	p.gate = flow.NewGate(p.st, p.metrics, wakeAll, p.log.Named("flow"))
	// Written before the Gate's first reading of the rules, which comes
	// before any delivery it rules on (checked by config.Validate).
	static, _ := flow.Limits(c.Targets.Limits)
	p.gate.WriteFirst(static)
	opts.Gate = p.gate
	if c.Mode == "intake" {
		p.flow = flow.NewControl(p.st, nil, wakeAll)
	} else {
		p.flow = flow.NewControl(p.st, p.gate, wakeAll)
	}
	p.sc = scanner.New(p.st, p.pub, p.metrics, opts, p.log.Named("scanner"))
	p.insp = inspector{Store: p.st, wake: p.sc.Wake, obs: p.metrics}
	p.own = scanner.NewOwnership(p.st, p.sc, p.id, c.Ownership.TTL, p.log.Named("ownership"))
}

// components lists what runs for the daemon's mode, in the order they are
// stopped: intake first (answer what was taken), then ownership (release
// the shards at once), the scanner (finish what was claimed), and the
// admin servers last, so probes and metrics stay up while the rest drains.
func (p *parts) components() ([]component, error) {
	var comps []component
	if p.c.Mode != "scanner" {
		in, err := p.intakes()
		if err != nil {
			return nil, err
		}
		comps = append(comps, in...)
	} else {
		p.in.Close()
	}
	if p.c.Mode != "intake" {
		comps = append(comps, p.scanning()...)
	}
	comps = append(comps, p.background()...)
	servers, err := p.servers()
	if err != nil {
		return nil, err
	}
	return append(append(comps, servers...), component{"nats-flush", p.flushOut}), nil
}

// flushOut waits for the shutdown, then sends what the delivery connection
// still buffers (the last deliveries' and settles' messages). It is the
// last component, so shutdown.timeout bounds it like the others; with
// NATS unreachable there is nothing to wait for.
func (p *parts) flushOut(ctx context.Context) error {
	<-ctx.Done()
	if !p.out.IsConnected() {
		return nil
	}
	fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.out.FlushWithContext(fctx)
	return nil
}

// intakes are the stream intake, if enabled, and the request intake. The
// stream intake stops first: both store until the end.
func (p *parts) intakes() ([]component, error) {
	var comps []component
	si, err := p.newStreamIntake()
	if err != nil {
		return nil, err
	}
	if si != nil {
		comps = append(comps, component{"stream-intake", si.Run})
	}
	c := p.c
	in := intake.NewIntake(p.in, p.st, p.insp, p.sc, p.metrics, intake.IntakeOptions{Options: p.intakeOptions(),
		Version: p.opt.version, Linger: c.Intake.Linger, RedactHeaders: c.UI.RedactHeaders, PendingBytes: intakeBytes(c), Flow: p.flow}, p.log.Named("intake"))
	p.metrics.WatchHeld("request_intake", in.HeldBytes)
	return append(comps, component{"intake", in.Run}), nil
}

// intakeOptions are what both intakes take alike, from one reading of
// the config.
func (p *parts) intakeOptions() intake.Options {
	c := p.c
	return intake.Options{Subject: c.Subject, Batch: c.Intake.Batch, MaxBatch: c.Intake.MaxBatch,
		Limits: c.EnvelopeLimits(), Policy: c.Policy(), JetStream: c.Targets.JetStream, Now: p.opt.now,
		Resends: c.Intake.DedupeWindow > 0}
}

// newStreamIntake builds the durable stream intake on a connection of its
// own (so its pulls and acks do not queue behind request replies), or nil
// when intake.stream.enabled is false.
func (p *parts) newStreamIntake() (*intake.StreamIntake, error) {
	c := p.c
	if !c.StreamEnabled() {
		return nil, nil
	}
	nc, err := bridge.Connect(c.NATS.URL, c.NATS.Name+"-stream", p.auth, p.log.Named("nats"), nil, nil, bridge.LivenessFor(c.Ownership.TTL))
	if err != nil {
		return nil, err
	}
	p.onClose(nc.Close) // the stream intake closes it when it stops; this, when it never ran
	s := c.Intake.Stream
	si := intake.NewStreamIntake(nc, p.st, p.sc, p.metrics, intake.StreamOptions{Options: p.intakeOptions(),
		Name: s.Name, Required: s.Enabled == "true", Replicas: s.Replicas, WorkQueue: s.Retention == "workqueue", MaxAge: s.MaxAge, MaxBytes: s.MaxBytes, Pull: s.Pull, PullBytes: streamBytes(c), AckWait: s.AckWait, RetryDelay: s.RetryDelay}, p.log.Named("stream"))
	p.metrics.WatchHeld("stream_intake", si.HeldBytes)
	return si, nil
}

// scanning are the parts that deliver: ownership, the scanner, the wake
// relay and the consistency checker (if scanner.check_interval is set).
func (p *parts) scanning() []component {
	p.metrics.WatchHeld("claims", func() int64 { n, _ := p.sc.HeldBytes(); return n })
	p.metrics.WatchHeld("settles", func() int64 { _, n := p.sc.HeldBytes(); return n })
	comps := []component{
		{"ownership", p.own.Run},
		{"scanner", p.sc.Run},
		{"wake", func(ctx context.Context) error { return p.relay.Run(ctx, p.sc.WakeLocal) }},
		{"flow", p.gate.Run},
	}
	p.metrics.WatchFlow(p.gate.Statuses)
	if p.c.Scanner.CheckInterval > 0 {
		chk := scanner.NewChecker(p.st, p.sc, p.metrics, p.c.Scanner.CheckInterval, p.log.Named("check"))
		comps = append(comps, component{"check", chk.Run})
	}
	return comps
}

// background are the parts every mode runs beside its work.
func (p *parts) background() []component {
	// Every daemon writes values (intake) or reads them (scanner): each
	// announces the newest format it reads, so the fleet writes one every
	// live daemon reads. Stopped late: it withdraws the announcement.
	comps := []component{{"formats", func(ctx context.Context) error {
		return p.st.RunFormats(ctx, p.id, p.c.Ownership.TTL, p.log.Named("formats"))
	}}}
	if len(p.c.Targets.Limits) > 0 && p.c.Mode == "intake" {
		// A delivering daemon's Gate writes them (WriteFirst).
		comps = append(comps, component{"flow-limits", p.setLimits})
	}
	if p.guard != nil {
		comps = append(comps, component{"redis-guard", func(ctx context.Context) error { return p.guard.Run(ctx, p.rdb) }})
	}
	return append(comps,
		component{"ready", func(ctx context.Context) error {
			// The publisher's Down covers its inbox proof (not in mode
			// intake) and natsReady the intake connection.
			if err := waitReady(ctx, p.st, p.c.Redis.Addrs, func() error { return p.natsReady(ctx) }, p.log); err != nil {
				return err
			}
			<-ctx.Done()
			return nil
		}},
		component{"sampler", func(ctx context.Context) error {
			p.metrics.Sample(ctx, p.st, p.sc.Owned, p.c.HTTP.SampleInterval, p.log.Named("admin"))
			return nil
		}})
}

// setLimits writes the limits of targets.limits to Redis in a daemon
// that does not deliver (mode intake), whose Gate never runs: its first
// Refresh writes them (WriteFirst), as a delivering daemon's does, trying
// again while Redis fails; then it waits for the shutdown.
func (p *parts) setLimits(ctx context.Context) error {
	wait := time.Second
	for {
		err := p.gate.Refresh(ctx)
		if err == nil || ctx.Err() != nil {
			break
		}
		p.log.Warn("cannot set the rate limits of targets.limits yet; trying again", "error", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
	<-ctx.Done()
	return nil
}
