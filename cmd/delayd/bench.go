package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/internal/bench"
	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/embedded"
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
			&cli.StringFlag{Name: "child-cpuprofile", Usage: "with --local or --embedded, the delayd child writes a CPU profile to this file", TakesFile: true},
			&cli.IntFlag{Name: "max-pending", Value: 4096, Usage: "most unacknowledged async publishes per connection (--stream, --compare)"},
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
	local, embedded, baseline, conns, asJSON := cmd.Bool("local"), cmd.Bool("embedded"), cmd.Bool("baseline"), int(cmd.Int("conns")), cmd.Bool("json")
	stream, compare, window := cmd.Bool("stream"), cmd.Bool("compare"), int(cmd.Int("max-pending"))
	stdout, stderr := o.stdout, o.stderr
	if w.Count < 1 || w.Concurrency < 1 || w.PayloadSize < 0 || w.Window <= 0 || conns < 1 || window < 1 {
		return usageErr(cmd, "--count, --concurrency, --conns, --window and --max-pending must be positive")
	}
	if cmd.Int("one-requester") < 0 {
		return usageErr(cmd, "--one-requester must be 0 (skip) or positive")
	}
	if len(childArgs(cmd)) > 0 && !local && !embedded {
		return usageErr(cmd, "--child-set and --child-cpuprofile need a child: add --local or --embedded")
	}
	for _, kv := range cmd.StringSlice("child-set") {
		key, _, ok := strings.Cut(kv, "=")
		if !ok {
			return usageErr(cmd, "--child-set %q: want KEY=VALUE", kv)
		}
		if benchOwnsKey(key) {
			return usageErr(cmd, "--child-set %s: the bench sets it itself, so that its child is the only delayd it talks to and loads (use the bench's own flags or --set for the servers: the child inherits them)", key)
		}
	}
	c, err := loadConfig(cmd, o.getenv)
	if err != nil {
		return err
	}
	// A child of its own answers on a subject prefix (and keeps its
	// stream) nobody else uses: whatever else runs on that NATS can
	// neither answer the bench nor be loaded by it.
	own := ""
	if local || embedded {
		own = strconv.FormatInt(time.Now().UnixNano(), 36)
		c.Subject = "bench" + own
		c.Intake.Stream.Name = "BENCH_" + strings.ToUpper(own)
	}
	if w.Target == c.Subject || len(w.Target) > len(c.Subject) && w.Target[:len(c.Subject)+1] == c.Subject+"." {
		// The service refuses its own subjects as targets.
		w.Target = "bench.target"
	}

	var child *benchChild
	if local || embedded {
		child, err = startChild(c, own, embedded, stream, inheritedArgs(cmd), childArgs(cmd), stderr)
		if err != nil {
			return err
		}
		defer child.kill()
		if !embedded {
			// Last, once the child is gone: its namespace was the bench's
			// alone, and what it leaves (lease hashes, the member list,
			// anything not delivered after an interrupt) must not stay in
			// the user's Redis.
			defer func() {
				child.kill()
				dropBenchNamespace(c, "bench-"+own, stderr)
			}()
		}
	}
	var cleanup *bridge.Probe // deletes the child's stream, on every way out

	clients := make([]*bridge.Probe, conns)
	for i := range clients {
		auth, err := daemon.NATSAuth(c)
		if err != nil {
			return err
		}
		nc, err := bridge.Dial(c.NATS.URL, "delayd-cli", auth, w.Timeout)
		// A child started with --embedded brings the NATS server up itself.
		for deadline := time.Now().Add(15 * time.Second); err != nil && child != nil && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			nc, err = bridge.Dial(c.NATS.URL, "delayd-cli", auth, w.Timeout)
		}
		if err != nil {
			return err
		}
		defer nc.Close()
		clients[i] = bridge.NewProbe(nc, c.Subject)
	}
	if child != nil && stream {
		cleanup = clients[0]
		defer func() {
			child.kill() // first: a running child would set its stream up again
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := cleanup.DeleteStream(dctx, c.Intake.Stream.Name); err != nil {
				fmt.Fprintf(stderr, "delayd bench: deleting the child's stream %s: %v\n", c.Intake.Stream.Name, err)
			}
		}()
	}
	if err := waitService(ctx, clients[0], child); err != nil {
		return err
	}

	so := bench.StreamOptions{Prefix: c.Subject, Window: window}
	var base float64
	if baseline {
		if stream {
			base, err = bench.StreamBaseline(ctx, clients, w, so)
		} else {
			base, err = bench.Baseline(ctx, clients, w)
		}
		if err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
	}
	progress := stderr
	var r bench.Result
	if stream {
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = clients[0].WaitStream(wctx, c.Intake.Stream.Name)
		cancel()
		if err == nil {
			r, err = bench.RunStream(ctx, clients, w, so, progress)
		}
	} else {
		r, err = bench.Run(ctx, clients, w, progress)
	}
	if err != nil {
		return err
	}
	if base > 0 {
		r.BaselineRate, r.IntakeRatio = base, r.IntakeRate/base
	}
	if n := int(cmd.Int("one-requester")); compare && n > 0 {
		// What one call costs a requester alone, beside JetStream's below.
		one, err := bench.DelaydOneRequester(ctx, clients[0], w, n)
		if err != nil {
			return fmt.Errorf("one requester: %w", err)
		}
		r.OneRequester = &one
		so.OneRequester = n
	}
	if child != nil {
		if r.Daemon, err = child.stop(); err != nil {
			return err
		}
	}
	var peer *bench.Result
	if compare {
		if peer, err = benchSchedules(ctx, w, so, clients, embedded, progress); err != nil {
			return fmt.Errorf("compare: %w", err)
		}
	}
	if err := printBench(stdout, r, peer, asJSON); err != nil {
		return err
	}
	// A run that lost, rejected or delivered early exits 1, so the bench
	// doubles as a smoke test (the Helm chart's helm test runs it).
	if r.Lost > 0 || r.Rejected > 0 || r.Early > 0 {
		return fmt.Errorf("bench: %d lost, %d rejected, %d early", r.Lost, r.Rejected, r.Early)
	}
	return nil
}

// benchSchedules runs the workload as JetStream message schedules: on the
// server delayd uses when it runs them (2.12 or newer), so both sides pay
// the same NATS, else on an in-process nats-server of its own.
func benchSchedules(ctx context.Context, w bench.Workload, so bench.StreamOptions, same []*bridge.Probe, embeddedChild bool, progress io.Writer) (*bench.Result, error) {
	if !embeddedChild && same[0].HasSchedules(ctx) {
		fmt.Fprintln(progress, "compare: JetStream schedules on delayd's nats-server")
		r, err := bench.Schedules(ctx, same, w, so, progress)
		return &r, err
	}
	if embeddedChild {
		fmt.Fprintln(progress, "compare: the embedded child's nats-server stopped with it: JetStream schedules on an in-process nats-server (a different server: compare each with its own echo)")
	} else {
		fmt.Fprintln(progress, "compare: delayd's nats-server has no message schedules (2.12+): JetStream schedules on an in-process nats-server (a different server: compare each with its own echo)")
	}
	conns := len(same)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	url := "nats://" + l.Addr().String()
	l.Close()
	srv, err := embedded.Start(url)
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	clients := make([]*bridge.Probe, conns)
	for i := range clients {
		nc, err := bridge.Dial(url, "delayd-cli", bridge.Auth{}, w.Timeout)
		if err != nil {
			return nil, err
		}
		defer nc.Close()
		clients[i] = bridge.NewProbe(nc, "bench")
	}
	r, err := bench.Schedules(ctx, clients, w, so, progress)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

func printBench(stdout io.Writer, r bench.Result, peer *bench.Result, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if peer != nil {
			return enc.Encode([]bench.Result{r, *peer})
		}
		return enc.Encode(r)
	}
	if peer != nil {
		bench.PrintCompare(stdout, []bench.Result{r, *peer})
		return nil
	}
	bench.Print(stdout, r)
	return nil
}

// benchChild is the delayd the bench started, watched so that a child
// that exits early (its port taken, a bad setting) stops the bench at once.
type benchChild struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // once exited is closed
}

// startChild runs this binary as "delayd run" with the bench's own
// subject prefix (c.Subject), namespace and intake stream (enabled only
// for --stream), so the bench can tell its child from any other delayd and
// read its CPU time and peak RSS when it exits.
func startChild(c config.Config, own string, embedded, stream bool, inherit, extra []string, stderr io.Writer) (*benchChild, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	// The bench's own --config and --set first, so that the child reads
	// the config the bench does (its Redis above all: the bench deletes
	// the child's keys through it afterwards), then the bench's settings
	// as --set, which win over both.
	args := append([]string{"run"}, inherit...)
	args = append(args, "--nats-url", c.NATS.URL, "--log-level", "warn", "--set", "http.addr=127.0.0.1:0", "--set", "ui.enabled=false",
		"--set", "subject="+c.Subject, "--set", "namespace=bench-"+own,
		"--set", "intake.stream.enabled="+strconv.FormatBool(stream), "--set", "intake.stream.name="+c.Intake.Stream.Name)
	if embedded {
		args = append(args, "--embedded")
	} else if len(c.Redis.Addrs) > 0 {
		args = append(args, "--redis-addrs", strings.Join(c.Redis.Addrs, ","))
	}
	cmd := exec.Command(self, append(args, extra...)...)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start delayd: %w", err)
	}
	ch := &benchChild{cmd: cmd, exited: make(chan struct{})}
	go func() {
		ch.err = cmd.Wait()
		close(ch.exited)
	}()
	return ch, nil
}

// benchOwnsKey reports whether the bench sets config key itself for its
// child: the keys that keep the child apart from any other delayd (its
// subject prefix, namespace and stream) and point it at the bench's
// servers (set them with the bench's --set: the child inherits it). A --child-set of one of them could make the bench load, and
// then clean up, a real deployment.
func benchOwnsKey(key string) bool {
	key = strings.ToLower(strings.TrimSpace(key))
	switch key {
	case "subject", "namespace", "intake.stream.enabled", "intake.stream.name", "nats.url", "embedded":
		return true
	}
	// How to reach Redis: the bench deletes the child's keys afterwards
	// through its own settings, which the child shares (--set for both).
	switch {
	case key == "redis.addrs", key == "redis.db", key == "redis.cluster", key == "redis.master_name",
		key == "redis.username", key == "redis.password", strings.HasPrefix(key, "redis.tls"):
		return true
	}
	return false
}

// dropBenchNamespace deletes the keys of the child's namespace ns.
func dropBenchNamespace(c config.Config, ns string, stderr io.Writer) {
	ropts, err := daemon.RedisOptions(c)
	if err == nil {
		rdb := store.NewClient(ropts)
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = store.DropNamespace(ctx, rdb, ns)
	}
	if err != nil {
		fmt.Fprintf(stderr, "delayd bench: the child's Redis keys ({%s:*}) were not deleted: %v\n", ns, err)
	}
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

// childArgs are the child's arguments from --child-set and
// --child-cpuprofile, after the bench's own (a later --set wins).
func childArgs(cmd *cli.Command) []string {
	var args []string
	for _, kv := range cmd.StringSlice("child-set") {
		args = append(args, "--set", kv)
	}
	if p := cmd.String("child-cpuprofile"); p != "" {
		args = append(args, "--cpuprofile", p)
	}
	return args
}

func (ch *benchChild) kill() {
	_ = ch.cmd.Process.Kill()
	<-ch.exited
}

func (ch *benchChild) stop() (*bench.Usage, error) {
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	<-ch.exited
	cmd := ch.cmd
	if err := ch.err; err != nil {
		return nil, fmt.Errorf("delayd child: %w", err)
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return nil, nil
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return &bench.Usage{CPUSeconds: cpu.Seconds(), PeakRSSMiB: float64(ru.Maxrss) / 1024}, nil
}

// waitService waits until a delayd answers, so a just-started child is
// not measured while it connects. With a child, only the child can answer
// (its own subject prefix), and a child that exits first ends the bench
// before anything was sent.
func waitService(ctx context.Context, c *bridge.Probe, child *benchChild) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		if child != nil {
			select {
			case <-child.exited:
				return fmt.Errorf("the delayd child exited before it answered (%v): nothing was sent; "+
					"is its NATS port already in use (another server, another delayd)?", child.err)
			default:
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := c.Delayd.Cancel(rctx, "bench-probe")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no delayd answers: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
