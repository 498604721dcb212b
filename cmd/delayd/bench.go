package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/internal/bench"
	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/store"
)

func benchCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure intake rate, lateness and loss; exit status 1 on any loss, rejection or early delivery",
		Flags: append(configFlags(flagNATSURL, flagRedisAddrs, flagSubject),
			&cli.IntFlag{Name: "count", Value: 20000, Usage: "envelopes to schedule"},
			&cli.IntFlag{Name: "concurrency", Value: 64, Usage: "concurrent requesters"},
			&cli.IntFlag{Name: "payload", Value: 128, Usage: "payload bytes"},
			&cli.DurationFlag{Name: "lead", Value: 2 * time.Second, Usage: "time from start to the first due time"},
			&cli.DurationFlag{Name: "window", Value: 2 * time.Second, Usage: "span the due times are spread over (due rate = count/window)"},
			&cli.StringFlag{Name: "target", Value: "delayd.bench.target", Usage: "subject to deliver to"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "per-request timeout"},
			&cli.DurationFlag{Name: "grace", Value: 5 * time.Second, Usage: "wait after the last due time before counting the rest as lost"},
			&cli.BoolFlag{Name: "local", Usage: "start a delayd child process against --nats-url and --redis-addrs and report its CPU and RSS"},
			&cli.BoolFlag{Name: "embedded", Aliases: []string{"embedded-redis"}, Usage: "like --local, but the child runs --embedded (in-process NATS and Redis emulation)"},
			&cli.BoolFlag{Name: "baseline", Value: true, Usage: "measure the request/reply ceiling with a trivial responder first"},
			&cli.IntFlag{Name: "conns", Value: 4, Usage: "NATS connections the requesters share"},
			&cli.BoolFlag{Name: "stream", Usage: "publish into the durable intake stream (<subject>.intake) with a window of async publishes and time until every envelope is pending in Redis; the baseline is a stream nobody consumes"},
			&cli.BoolFlag{Name: "compare", Usage: "also run NATS JetStream message schedules (ADR-51) on the same workload, on an in-process nats-server, and print both side by side, with what one call costs one requester alone"},
			&cli.IntFlag{Name: "one-requester", Value: bench.OneRequesterCalls, Usage: "with --compare, time this many calls in a row from one requester alone, beside an echo (0: skip)"},
			&cli.StringSliceFlag{Name: "child-set", Usage: "with --local or --embedded, set a config key of the delayd child, e.g. --child-set targets.fire_and_forget=delayd.bench.> to measure without the interest check (repeatable)"},
			&cli.StringFlag{Name: "child-binary", Usage: "with --local, run this delayd binary as the child instead of the bench's own, to compare builds with one bench (its \"run\" must take the flags --local passes)", TakesFile: true},
			&cli.StringFlag{Name: "child-cpuprofile", Usage: "with --local or --embedded, the delayd child writes a CPU profile to this file", TakesFile: true},
			&cli.IntFlag{Name: "nats-pid", Usage: "nats-server's process id (Linux), to add its CPU to the per-process split of each run (the bench itself, the delayd child and Redis' main thread are read with --local)"},
			&cli.IntFlag{Name: "max-pending", Value: 4096, Usage: "most unacknowledged async publishes per connection (--stream, --compare)"},
			&cli.IntFlag{Name: "batch", Usage: "send batch requests of this many envelopes (ScheduleBatch, header Delayd-Batch) instead of one request per envelope; the intake rate counts envelopes, the baseline the echo's requests"},
			&cli.BoolFlag{Name: "client-batching", Usage: "(also, with --batch) send single Schedule calls through the client's Batching mode, at most --batch (default 100) per batch, linger 1ms"},
			jsonFlag("print the result as JSON")),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			return runBench(ctx, cmd, o)
		},
	}
}

func runBench(ctx context.Context, cmd *cli.Command, o cliIO) error {
	w := bench.Workload{
		Count: int(cmd.Int("count")), Concurrency: int(cmd.Int("concurrency")), PayloadSize: int(cmd.Int("payload")),
		Lead: cmd.Duration("lead"), Window: cmd.Duration("window"), Target: cmd.String("target"),
		Timeout: cmd.Duration("timeout"), Grace: cmd.Duration("grace"),
	}
	local, embedded := cmd.Bool("local"), cmd.Bool("embedded")
	opts := bench.Options{Conns: int(cmd.Int("conns")), Baseline: cmd.Bool("baseline"), Stream: cmd.Bool("stream"),
		Compare: cmd.Bool("compare"), OneRequester: int(cmd.Int("one-requester")), MaxPending: int(cmd.Int("max-pending")),
		Batch: int(cmd.Int("batch")), ClientBatching: cmd.Bool("client-batching"), Progress: o.stderr}
	if opts.Batch < 0 {
		return usageErr(cmd, "--batch must be 0 (one request per envelope) or positive")
	}
	if opts.Stream && (opts.Batch > 0 || opts.ClientBatching) {
		return usageErr(cmd, "--batch and --client-batching measure the request intake: not with --stream")
	}
	if w.Count < 1 || w.Concurrency < 1 || w.PayloadSize < 0 || w.Window <= 0 || opts.Conns < 1 || opts.MaxPending < 1 {
		return usageErr(cmd, "--count, --concurrency, --conns, --window and --max-pending must be positive")
	}
	if opts.OneRequester < 0 {
		return usageErr(cmd, "--one-requester must be 0 (skip) or positive")
	}
	if opts.NATSPid = int(cmd.Int("nats-pid")); opts.NATSPid != 0 {
		if embedded {
			return usageErr(cmd, "--nats-pid: with --embedded the NATS server runs inside the delayd child, and its CPU is the child's")
		}
		comm, err := bench.CheckPid(opts.NATSPid)
		if err != nil {
			return usageErr(cmd, "--nats-pid: %v", err)
		}
		if !strings.Contains(comm, "nats") {
			fmt.Fprintf(o.stderr, "delayd bench: --nats-pid %d is %q, not a nats-server: its CPU is reported as nats all the same\n", opts.NATSPid, comm)
		}
	}
	childSet, childProfile, childBinary := cmd.StringSlice("child-set"), cmd.String("child-cpuprofile"), cmd.String("child-binary")
	if (len(childSet) > 0 || childProfile != "") && !local && !embedded {
		return usageErr(cmd, "--child-set and --child-cpuprofile need a child: add --local or --embedded")
	}
	if childBinary != "" && !local {
		return usageErr(cmd, "--child-binary needs --local")
	}
	if err := bench.CheckChildSet(childSet); err != nil {
		return usageErr(cmd, "%v", err)
	}
	c, err := loadConfig(cmd, o.getenv)
	if err != nil {
		return err
	}
	auth, err := daemon.NATSAuth(c)
	if err != nil {
		return err
	}
	opts.NATSURL, opts.Subject, opts.StreamName = c.NATS.URL, c.Subject, c.Intake.Stream.Name
	opts.Dial = func(url string) (*nats.Conn, error) { return bridge.Dial(url, "delayd-cli", auth, w.Timeout) }
	if local || embedded {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		if childBinary != "" {
			self = childBinary
		}
		opts.Child = &bench.ChildOptions{Binary: self, Embedded: embedded, RedisAddrs: c.Redis.Addrs,
			Inherit: inheritedArgs(cmd), Set: childSet, CPUProfile: childProfile, Stderr: o.stderr,
			DropNamespace: func(ctx context.Context, ns string) error { return dropNamespace(ctx, c, ns) }}
		if !embedded {
			ropts, err := daemon.RedisOptions(c)
			if err != nil {
				return err
			}
			rdb := store.NewClient(ropts)
			defer rdb.Close()
			opts.Child.RedisCPU = func(ctx context.Context) (float64, error) { return store.RedisCPU(ctx, rdb) }
		}
	}
	r, others, err := bench.Run(ctx, w, opts)
	if err != nil {
		return err
	}
	if err := printBench(o.stdout, r, others, cmd.Bool("json")); err != nil {
		return err
	}
	// A run that lost, rejected or delivered early exits 1, so the bench
	// doubles as a smoke test (the Helm chart's helm test runs it). Only
	// delayd's runs count: JetStream schedules' are for comparison.
	for _, d := range append([]bench.Result{r}, others...) {
		if d.Mode == bench.ModeSchedules {
			continue
		}
		if d.Lost > 0 || d.Rejected > 0 || d.Early > 0 {
			return fmt.Errorf("bench (%s): %d lost, %d rejected, %d early", d.Mode, d.Lost, d.Rejected, d.Early)
		}
	}
	return nil
}

// printBench prints one result, or several side by side (a JSON array).
func printBench(stdout io.Writer, r bench.Result, others []bench.Result, asJSON bool) error {
	all := append([]bench.Result{r}, others...)
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if len(others) > 0 {
			return enc.Encode(all)
		}
		return enc.Encode(r)
	}
	if len(others) > 0 {
		bench.PrintCompare(stdout, all)
		return nil
	}
	bench.Print(stdout, r)
	return nil
}

// dropNamespace deletes the keys of the bench child's namespace ns through
// the bench's own Redis settings, which the child inherited. It stays here
// rather than in internal/bench so that the bench remains a NATS client of
// delayd: the Redis side is the store's.
func dropNamespace(ctx context.Context, c config.Config, ns string) error {
	ropts, err := daemon.RedisOptions(c)
	if err != nil {
		return err
	}
	rdb := store.NewClient(ropts)
	defer rdb.Close()
	_, err = store.DropNamespace(ctx, rdb, ns)
	return err
}

// inheritedArgs are the bench's own --config and --set, for its child.
func inheritedArgs(cmd *cli.Command) []string {
	var args []string
	if p := cmd.String("config"); p != "" {
		args = append(args, "--config", p)
	}
	for _, kv := range cmd.StringSlice("set") {
		args = append(args, "--set", kv)
	}
	return args
}
