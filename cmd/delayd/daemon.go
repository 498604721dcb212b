package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/embedded"
	"github.com/delayd/delayd/internal/scanner"
	"github.com/delayd/delayd/internal/store"
)

func runCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("run", "run [flags]", stderr)
	cf := addConfigFlags(fs)
	fs.BoolFunc("embedded", "start an in-process NATS server and Redis emulation (nothing durable)", func(v string) error {
		cf.set["embedded"] = v
		return nil
	})
	fs.BoolFunc("log-json", "log as JSON lines", func(v string) error {
		cf.set["log.json"] = v
		return nil
	})
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile to this file until shutdown")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	c, err := cf.load(getenv)
	if err != nil {
		return err
	}
	return daemon(ctx, c, newLogger(c, stderr))
}

// daemon runs delayd until ctx is cancelled, then shuts down in order:
// stop intake (answering every request already taken), let the scanner
// finish the batches it is delivering, then drain NATS and close Redis.
func daemon(ctx context.Context, c config.Config, log hclog.Logger) error {
	log.Info("starting", "version", buildVersion(), "shards", c.Shards, "namespace", c.Namespace)
	if c.Embedded {
		srv, err := embedded.Start(c.NATS.URL)
		if err != nil {
			return err
		}
		defer srv.Stop()
		c.Redis.Addrs = []string{srv.RedisAddr}
		log.Warn("EMBEDDED MODE: in-process NATS and Redis emulation; NOTHING IS DURABLE, every scheduled message is lost when delayd stops",
			"nats", c.NATS.URL, "redis", srv.RedisAddr)
	}

	store.SetLogger(log.Named("redis"))
	st := store.New(store.NewClient(store.Options{
		Addrs: c.Redis.Addrs, Username: c.Redis.Username, Password: c.Redis.Password, DB: c.Redis.DB,
	}), c.Namespace, c.Shards)
	defer st.Close()

	in, err := bridge.Connect(c.NATS.URL, c.NATS.Name+"-intake", log.Named("nats"))
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := bridge.Connect(c.NATS.URL, c.NATS.Name, log.Named("nats"))
	if err != nil {
		return err
	}
	defer out.Close()

	sc := scanner.New(st, bridge.NewPublisher(out), nil, scanner.Options{
		ClaimBatch: c.Scanner.ClaimBatch, Lease: c.Scanner.Lease, IdleInterval: c.Scanner.IdleInterval,
		RetryBackoff: c.Scanner.RetryBackoff, MaxAttempts: c.Scanner.MaxAttempts,
	}, log.Named("scanner"))
	intake := bridge.NewIntake(in, out, st, sc, nil, bridge.IntakeOptions{
		Subject: c.Subject, Version: buildVersion(), Batch: c.Intake.Batch, Linger: c.Intake.Linger,
		Limits: c.EnvelopeLimits(), Policy: c.Policy(),
	}, log.Named("intake"))

	intakeCtx, stopIntake := context.WithCancel(context.Background())
	scanCtx, stopScan := context.WithCancel(context.Background())
	defer stopIntake()
	defer stopScan()
	intakeDone, scanDone := make(chan error, 1), make(chan error, 1)
	go func() { intakeDone <- intake.Run(intakeCtx) }()
	go func() { scanDone <- sc.Run(scanCtx) }()
	readyCtx, stopReady := context.WithCancel(ctx)
	defer stopReady()
	go waitReady(readyCtx, st, out.IsConnected, log)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-intakeDone:
		intakeDone <- runErr
	case runErr = <-scanDone:
		scanDone <- runErr
	}
	stopReady()
	log.Info("shutting down", "deadline", c.Shutdown.Timeout)
	deadline := time.After(c.Shutdown.Timeout)
	for _, step := range []struct {
		name string
		stop context.CancelFunc
		done chan error
	}{{"intake", stopIntake, intakeDone}, {"scanner", stopScan, scanDone}} {
		step.stop()
		select {
		case err := <-step.done:
			runErr = errors.Join(runErr, err)
		case <-deadline:
			return fmt.Errorf("shutdown deadline %s exceeded while stopping %s; unacknowledged envelopes will be redelivered after their lease", c.Shutdown.Timeout, step.name)
		}
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = out.FlushWithContext(drainCtx)
	log.Info("stopped")
	return runErr
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
