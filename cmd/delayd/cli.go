package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/config"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = "0.1.0-dev"

// stdin is where `delayd schedule` reads a payload given as "-" or omitted.
var stdin io.Reader = os.Stdin

// environ lists the process environment for the config's check of
// DELAYD_* names (values are read through run's getenv).
var environ = os.Environ

// errUsage marks command-line mistakes, which exit with status 2.
var errUsage = errors.New("usage")

const usage = `delayd — delayed delivery for NATS, backed by Redis.

Usage:
  delayd [run] [flags]            run the daemon (the default command)
  delayd schedule [flags] [PAYLOAD]
                                  schedule a message; PAYLOAD or stdin
  delayd cancel [flags] ID        cancel a scheduled message
  delayd get ID                   show where a scheduled message is
  delayd list [flags]             list scheduled (or --dead) messages, a page at a time
  delayd stats                    pending, inflight and dead counts per shard
  delayd dead list|replay|purge   manage envelopes whose delivery kept failing
  delayd doctor [--repair]        check the data in Redis for consistency (reads Redis directly)
  delayd bench [flags]            measure intake rate, lateness and loss
  delayd config [flags]           print the effective configuration, secrets redacted
  delayd healthcheck [flags]      exit 0 when this daemon's /readyz answers 200
  delayd version                  print the version
  delayd help [COMMAND]           show help

Run "delayd COMMAND --help" for the flags of a command.
Quick start without any servers installed:
  delayd run --embedded
`

// run is the whole program; main only supplies the process environment.
// Only run touches signals: SIGINT and SIGTERM cancel the context every
// component runs under.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	cmd, rest := "run", args[1:]
	if len(rest) == 1 && (rest[0] == "-h" || rest[0] == "--help" || rest[0] == "-help") {
		fmt.Fprint(stdout, usage)
		return nil
	}
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		cmd, rest = rest[0], rest[1:]
	}
	switch cmd {
	case "run":
		return runCmd(ctx, rest, getenv, stdout, stderr)
	case "schedule":
		return scheduleCmd(ctx, rest, getenv, stdout, stderr)
	case "cancel":
		return cancelCmd(ctx, rest, getenv, stdout, stderr)
	case "get":
		return getCmd(ctx, rest, getenv, stdout, stderr)
	case "list":
		return listCmd(ctx, rest, getenv, stdout, stderr)
	case "stats":
		return statsCmd(ctx, rest, getenv, stdout, stderr)
	case "dead":
		return deadCmd(ctx, rest, getenv, stdout, stderr)
	case "bench":
		return benchCmd(ctx, rest, getenv, stdout, stderr)
	case "doctor":
		return doctorCmd(ctx, rest, getenv, stdout, stderr)
	case "config":
		return configCmd(ctx, rest, getenv, stdout, stderr)
	case "healthcheck":
		return healthcheckCmd(ctx, rest, getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "delayd", buildVersion())
		return nil
	case "help":
		if len(rest) > 0 {
			return run(ctx, []string{args[0], rest[0], "--help"}, getenv, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

func buildVersion() string {
	if version != "0.1.0-dev" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return version
}

// exitCode prints err and maps it to a process status: 0 ok, 2 usage,
// 1 anything else.
func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "delayd:", err)
		return 2
	}
	fmt.Fprintln(stderr, "delayd:", err)
	return 1
}

// newFlags returns a flag set that prints its help to stderr and reports
// errors instead of exiting.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: delayd %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags and wraps mistakes as usage errors.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

// configFlags are the flags every command shares; each maps to a config key
// and only the ones given override the file and environment.
type configFlags struct {
	path string
	set  map[string]string
}

func addConfigFlags(fs *flag.FlagSet) *configFlags {
	cf := &configFlags{set: map[string]string{}}
	fs.StringVar(&cf.path, "config", "", "YAML config file (env DELAYD_CONFIG)")
	for flagName, key := range map[string]string{
		"nats-url":    "nats.url",
		"redis-addrs": "redis.addrs",
		"log-level":   "log.level",
		"subject":     "subject",
	} {
		fs.Func(flagName, fmt.Sprintf("sets %s (env %s)", key, config.EnvName(key)), func(v string) error {
			cf.set[key] = v
			return nil
		})
	}
	fs.Func("set", "sets any config key: --set scanner.lease=5s (repeatable)", func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok {
			return fmt.Errorf("want key=value, got %q", v)
		}
		cf.set[k] = val
		return nil
	})
	return cf
}

func (cf *configFlags) load(getenv func(string) string) (config.Config, error) {
	path := cf.path
	if path == "" {
		path = getenv("DELAYD_CONFIG")
	}
	c, err := config.Load(config.Sources{Path: path, Getenv: getenv, Environ: environ(), Flags: cf.set})
	if err != nil {
		return c, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

func newLogger(c config.Config, w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       "delayd",
		Level:      hclog.LevelFromString(c.Log.Level),
		JSONFormat: c.Log.JSON,
		Output:     w,
	})
}
