package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nuid"
	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/internal/admin"
	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/embedded"
	"github.com/delayd/delayd/internal/scanner"
	"github.com/delayd/delayd/internal/store"
)

func runCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "run the daemon (the default command)",
		Flags: append(configFlags(flagNATSURL, flagRedisAddrs, flagSubject, flagLogLevel, flagEmbedded, flagLogJSON),
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile to this file until shutdown", TakesFile: true}),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if cmd.Args().Present() {
				// "delayd bogus" lands here too, as run is the default.
				return usageErr(cmd.Root(), "unknown command or argument %q", cmd.Args().First())
			}
			if p := cmd.String("cpuprofile"); p != "" {
				f, err := os.Create(p)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			c, err := loadConfig(cmd, o.getenv)
			if err != nil {
				return err
			}
			log := newLogger(c, o.stderr)
			if err := daemon(ctx, c, log); err != nil {
				// Through the logger, so that with log.json the last
				// line is JSON too; main then prints nothing more.
				log.Error("delayd stopped", "error", err)
				return &loggedErr{err}
			}
			return nil
		},
	}
}

// daemon runs delayd until ctx is cancelled, then shuts down in order:
// stop intake (answering every request already taken), let the scanner
// finish the batches it is delivering, then drain NATS and close Redis.
func daemon(ctx context.Context, c config.Config, log hclog.Logger, opts ...daemonOption) error {
	var o daemonOptions
	for _, f := range opts {
		f(&o)
	}
	log.Info("starting", "version", buildVersion(), "shards", c.Shards, "namespace", c.Namespace)
	setMemoryLimit(log)
	if c.Embedded {
		srv, err := embedded.Start(c.NATS.URL)
		if err != nil {
			return err
		}
		defer srv.Stop()
		c.Redis.Addrs = []string{srv.RedisAddr}
		log.Warn("EMBEDDED MODE: in-process NATS and Redis emulation; NOTHING IS DURABLE, every scheduled message is lost when delayd stops",
			"nats", config.RedactURL(c.NATS.URL), "redis", srv.RedisAddr)
	}

	metrics := admin.NewMetrics(buildVersion())
	store.SetLogger(log.Named("redis"))
	log.Info("roles", "mode", c.Mode)
	ropts, err := redisOptions(c)
	if err != nil {
		return err
	}
	var guard *store.Guard
	if !c.Embedded { // the emulation neither evicts nor persists
		guard = store.NewGuard(c.Redis.AllowEviction, log.Named("redis"))
		ropts.OnConnect = guard.OnConnect
	}
	rdb := store.NewClient(ropts)
	sopts := append(o.store, store.WithStreamMemory(c.StreamDedupeWindow()))
	if r := c.Redis; r.WaitReplicas > 0 || r.WaitLocalFsync {
		sopts = append(sopts, store.WithWait(store.WaitOptions{Replicas: r.WaitReplicas, Timeout: r.WaitTimeout,
			LocalFsync: r.WaitLocalFsync, Observer: metrics}))
	}
	st := store.New(rdb, c.Namespace, c.Shards, sopts...)
	defer st.Close()
	if guard != nil {
		// Refuse to start on an evicting Redis. An unreachable one is
		// checked on its first connection, like every reconnect.
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := guard.Check(gctx, rdb)
		cancel()
		if err != nil {
			return err
		}
	}
	if err := checkWait(ctx, c, st, log.Named("redis")); err != nil {
		return err
	}
	auth, err := natsAuth(c)
	if err != nil {
		return err
	}

	in, err := bridge.Connect(c.NATS.URL, c.NATS.Name+"-intake", auth, log.Named("nats"), nil, nil)
	if err != nil {
		return err
	}
	defer in.Close()
	refusals := bridge.NewRefusals()
	out, err := bridge.Connect(c.NATS.URL, c.NATS.Name, auth, log.Named("nats"), metrics.NATSReconnect, refusals)
	if err != nil {
		return err
	}
	defer out.Close()

	metrics.WatchNATS(func() bool { return out.IsConnected() && (c.Mode == "scanner" || in.IsConnected()) })

	pub, err := bridge.NewPublisher(out, refusals, bridge.PublisherOptions{
		JetStream: c.Targets.JetStream, FireAndForget: c.Targets.FireAndForget})
	if err != nil {
		return err
	}
	defer pub.Close()
	scanOpts := scanner.Options{
		ClaimBatch: c.Scanner.ClaimBatch, ClaimBytes: claimBytes(c, log), Lease: c.Scanner.Lease, IdleInterval: c.Scanner.IdleInterval,
		RetryBackoff: c.Scanner.RetryBackoff, RetryBackoffMax: c.Scanner.RetryBackoffMax,
		MaxAttempts: c.Scanner.MaxAttempts, NoInterestRetryFor: c.Scanner.NoInterestRetryFor, Shared: true,
	}
	if c.Dead.Publish {
		scanOpts.DeadSubject = c.Subject + ".dead"
	}
	var relay *bridge.WakeRelay
	scanOpts.Announce = func(shard int, dueMs int64) { relay.Announce(shard, dueMs) }
	sc := scanner.New(st, pub, metrics, scanOpts, log.Named("scanner"))
	relay = bridge.NewWakeRelay(out, c.Subject, sc.WakeLocal, log.Named("wake"))
	insp := inspector{Store: st, wake: sc.Wake, obs: metrics}
	intake := bridge.NewIntake(in, st, insp, sc, metrics, bridge.IntakeOptions{
		Subject: c.Subject, Version: buildVersion(), Batch: c.Intake.Batch, Linger: c.Intake.Linger,
		Limits: c.EnvelopeLimits(), Policy: c.Policy(), RedactHeaders: c.UI.RedactHeaders, Now: o.now,
		JetStream: c.Targets.JetStream, PendingBytes: intakeBytes(c),
	}, log.Named("intake"))
	id := daemonID(c.NATS.Name)
	own := scanner.NewOwnership(st, sc, id, c.Ownership.TTL, log.Named("ownership"))
	formats := func(ctx context.Context) error { return st.RunFormats(ctx, id, c.Ownership.TTL, log.Named("formats")) }

	// Stopped in this order: intake first (answer what was taken), then
	// ownership (release the shards at once), the scanner (finish what was
	// claimed), and the admin server last, so probes and metrics stay up
	// while the rest drains.
	var comps []component
	if c.Mode != "scanner" {
		si, err := streamIntake(c, auth, st, sc, metrics, o, log)
		if err != nil {
			return err
		}
		if si != nil { // stopped before the request intake: both store until the end
			comps = append(comps, component{"stream-intake", si.Run})
		}
		comps = append(comps, component{"intake", intake.Run})
	} else {
		in.Close()
	}
	if c.Mode != "intake" {
		comps = append(comps,
			component{"ownership", own.Run},
			component{"scanner", sc.Run},
			component{"wake", relay.Run})
		if c.Scanner.CheckInterval > 0 {
			chk := scanner.NewChecker(st, sc, metrics, c.Scanner.CheckInterval, log.Named("check"))
			comps = append(comps, component{"check", chk.Run})
		}
	}
	// Every daemon writes values (intake) or reads them (scanner): each
	// announces the newest format it reads, so the fleet writes one every
	// live daemon reads. Stopped late: it withdraws the announcement.
	comps = append(comps, component{"formats", formats})
	if guard != nil {
		comps = append(comps, component{"redis-guard", func(ctx context.Context) error { return guard.Run(ctx, rdb) }})
	}
	comps = append(comps,
		component{"ready", func(ctx context.Context) error { waitReady(ctx, st, out.IsConnected, log); <-ctx.Done(); return nil }},
		component{"sampler", func(ctx context.Context) error {
			metrics.Sample(ctx, st, sc.Owned, c.HTTP.SampleInterval, log.Named("admin"))
			return nil
		}})
	if c.HTTP.Addr != "" {
		checks := []admin.Check{
			{Name: "nats", Fn: func(context.Context) error {
				if (c.Mode != "scanner" && !in.IsConnected()) || !out.IsConnected() {
					return errors.New("not connected")
				}
				return nil
			}},
			{Name: "redis", Fn: st.Ready},
		}
		if c.Mode != "intake" {
			checks = append(checks, admin.Check{Name: "shards", Fn: own.Ready})
		}
		srv, err := admin.Listen(c.HTTP.Addr, metrics, checks, log.Named("admin"))
		if err != nil {
			return err
		}
		comps = append(comps, component{"admin", srv.Run})
	}
	if c.UI.Enabled && c.UI.Addr != "" {
		ui := admin.NewUI(insp, metrics, admin.UIOptions{
			AllowActions: c.UI.AllowActions, ShowPayloads: c.UI.ShowPayloads, RedactHeaders: c.UI.RedactHeaders,
			BasicUser: c.UI.BasicAuthUser, BasicPass: c.UI.BasicAuthPassword, BearerToken: c.UI.BearerToken,
			Policy: c.Policy(), JetStream: c.Targets.JetStream,
		}, log.Named("ui"))
		srv, err := admin.ListenUI(c.UI.Addr, ui, log.Named("ui"))
		if err != nil {
			return err
		}
		if !config.Loopback(c.UI.Addr) {
			log.Warn("the console is reachable from the network", "addr", c.UI.Addr,
				"auth", c.UI.BasicAuthUser != "" || c.UI.BearerToken != "", "insecure", c.UI.Insecure)
		}
		comps = append(comps, component{"console", srv.Run})
	}
	err = runOrdered(ctx, comps, c.Shutdown.Timeout, log)
	drainCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = out.FlushWithContext(drainCtx)
	log.Info("stopped")
	return err
}

// checkWait refuses to start when Redis cannot confirm writes as the
// redis.wait_* settings ask (WAITAOF missing), and warns when fewer
// replicas are connected than wait_replicas. An unreachable Redis is left
// to the retries: every wait then falls short, which is safe.
func checkWait(ctx context.Context, c config.Config, st *store.Store, log hclog.Logger) error {
	r := c.Redis
	if r.WaitReplicas == 0 && !r.WaitLocalFsync {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	replicas, err := st.CheckWait(wctx)
	cancel()
	switch {
	case errors.Is(err, store.ErrWaitUnsupported):
		return err
	case err != nil:
		log.Warn("cannot check the wait settings against Redis yet", "error", err)
	case replicas < r.WaitReplicas:
		log.Warn("fewer replicas connected than redis.wait_replicas: schedules and cancels get 504 until they are back; deliveries go on",
			"connected", replicas, "wait_replicas", r.WaitReplicas)
	default:
		log.Info("writes wait for replicas", "wait_replicas", r.WaitReplicas, "wait_timeout", r.WaitTimeout,
			"wait_local_fsync", r.WaitLocalFsync, "connected", replicas)
	}
	return nil
}

// inspector is the store as the operator endpoints (NATS and the console)
// see it: a replay also wakes the scanner of the replayed envelopes'
// shards, so they go out now rather than at the next idle tick; replays
// and purges are counted, so the dead-set counters agree with the set.
type inspector struct {
	*store.Store
	wake func(shard int, dueMs int64)
	obs  *admin.Metrics
}

func (i inspector) Purge(ctx context.Context, ids []string) (int, error) {
	n, err := i.Store.Purge(ctx, ids)
	i.obs.Purged(n)
	return n, err
}

func (i inspector) Replay(ctx context.Context, ids []string) (int, error) {
	n, err := i.Store.Replay(ctx, ids)
	if n > 0 {
		i.obs.Redelivered("replay", n)
		woken := map[int]bool{}
		for _, id := range ids {
			if sh := i.Shard(id); !woken[sh] {
				woken[sh] = true
				i.wake(sh, 0)
			}
		}
	}
	return n, err
}

// daemonOptions are test seams of the daemon.
type daemonOptions struct {
	now   func() time.Time // the local wall clock; Redis time decides due times
	store []store.Option
}

// withNewestFormat makes the daemon read (and, once the fleet agrees,
// write) a simulated next stored format, as the next version would.
func withNewestFormat(f int) daemonOption {
	return func(o *daemonOptions) { o.store = append(o.store, store.WithNewestFormat(f)) }
}

type daemonOption func(*daemonOptions)

// withClock replaces the daemon's wall clock, to prove that a skewed local
// clock cannot make anything fire early.
func withClock(now func() time.Time) daemonOption {
	return func(o *daemonOptions) { o.now = now }
}

// component is one long-running part of the daemon.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// runOrdered runs every component until ctx is done or one of them returns
// (a failure: the first to fail stops the rest), then stops them one at a
// time, in order, all within the deadline.
func runOrdered(ctx context.Context, comps []component, deadline time.Duration, log hclog.Logger) error {
	stops := make([]context.CancelFunc, len(comps))
	dones := make([]chan error, len(comps))
	failed := make(chan int, len(comps))
	for i, c := range comps {
		cctx, cancel := context.WithCancel(context.Background())
		stops[i], dones[i] = cancel, make(chan error, 1)
		go func() {
			err := c.run(cctx)
			dones[i] <- err
			failed <- i
		}()
	}
	var runErr error
	select {
	case <-ctx.Done():
	case i := <-failed:
		runErr = <-dones[i]
		dones[i] <- runErr
		log.Error("component stopped unexpectedly, shutting down", "component", comps[i].name, "error", runErr)
		runErr = fmt.Errorf("%s: %w", comps[i].name, orStopped(runErr))
	}
	log.Info("shutting down", "deadline", deadline)
	timeout := time.After(deadline)
	for i, c := range comps {
		stops[i]()
		select {
		case err := <-dones[i]:
			if err != nil && !errors.Is(runErr, err) {
				runErr = errors.Join(runErr, fmt.Errorf("%s: %w", c.name, err))
			}
		case <-timeout:
			return fmt.Errorf("shutdown deadline %s exceeded while stopping %s; unacknowledged envelopes will be redelivered after their lease", deadline, c.name)
		}
	}
	return runErr
}

func orStopped(err error) error {
	if err == nil {
		return errors.New("stopped")
	}
	return err
}

// waitReady logs "ready" once Redis answers with the scripts loaded and NATS
// is connected, retrying with backoff so an unreachable Redis at start is a
// logged wait, not a crash.
func waitReady(ctx context.Context, st *store.Store, natsUp func() bool, log hclog.Logger) {
	backoff := 50 * time.Millisecond
	for warned := false; ; {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := st.Ping(pctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		if !warned {
			log.Warn("Redis not reachable yet, retrying", "error", err)
			warned = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	for !natsUp() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	log.Info("ready")
}

// daemonID names this daemon in the member set and as a shard's owner:
// the NATS name, the host, so an operator sees where a shard is scanned,
// and a unique suffix.
func daemonID(name string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return name + "@" + host + "-" + nuid.Next()
}
