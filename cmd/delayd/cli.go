package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/internal/config"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = "0.2.0-dev"

// stdin is where `delayd schedule` reads a payload given as "-" or omitted.
var stdin io.Reader = os.Stdin

// environ lists the process environment for the config's check of
// DELAYD_* names (values are read through run's getenv).
var environ = os.Environ

// errUsage marks command-line mistakes, which exit with status 2.
var errUsage = errors.New("usage")

// errNotFound marks an id that is not stored (exit status 1, like any
// failure, but callers can tell it apart).
var errNotFound = errors.New("not found")

// cliIO is what every command writes to and reads the environment from.
type cliIO struct {
	getenv         func(string) string
	stdout, stderr io.Writer
}

// run is the whole program; main only supplies the process environment.
// Only run touches signals: SIGINT and SIGTERM cancel the context every
// component runs under.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := newApp(cliIO{getenv, stdout, stderr}).Run(ctx, args)
	if err != nil && strings.HasPrefix(err.Error(), "No help topic") {
		// The library's "help NAME" for an unknown NAME: a usage mistake.
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return err
}

// newApp builds the command tree. Each command declares only the flags it
// uses, so a client command never lists daemon-only flags; flags may
// follow positional arguments ("delayd get ID --json").
func newApp(o cliIO) *cli.Command {
	app := &cli.Command{
		Name:  "delayd",
		Usage: "delayed delivery for NATS, backed by Redis",
		Description: "Without a command, delayd runs the daemon (delayd run).\n" +
			"Quick start without any servers installed: delayd run --embedded\n" +
			"Exit status: 0 ok, 1 failed or not found, 2 usage.",
		DefaultCommand:        "run",
		EnableShellCompletion: true,
		ConfigureShellCompletionCommand: func(c *cli.Command) {
			c.Hidden = false
			c.Usage = "print a shell completion script: delayd completion bash|zsh|fish|pwsh"
			print := c.Action
			c.Action = func(ctx context.Context, cmd *cli.Command) error {
				if !cmd.Args().Present() {
					return usageErr(cmd, "name a shell: bash, zsh, fish or pwsh")
				}
				return print(ctx, cmd)
			}
		},
		Writer:    o.stdout,
		ErrWriter: o.stderr,
		// Errors are returned to main, which prints them and picks the
		// exit status; the library must never exit the process itself.
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
		Commands: []*cli.Command{
			runCommand(o), scheduleCommand(o), cancelCommand(o), getCommand(o), listCommand(o),
			statsCommand(o), deadCommand(o), doctorCommand(o), benchCommand(o), configCommand(o),
			healthcheckCommand(o), intakeCommand(o), migrateCommand(o),
			limitCommand(o), limitsCommand(o), pauseCommand(o, false), pauseCommand(o, true),
			{
				Name:  "version",
				Usage: "print the version",
				Action: func(_ context.Context, cmd *cli.Command) error {
					if cmd.Args().Present() {
						return usageErr(cmd, "unexpected argument %q", cmd.Args().First())
					}
					fmt.Fprintln(o.stdout, versionLine())
					return nil
				},
			},
		},
	}
	strict(app)
	return app
}

// strict applies the settings every command shares: usage mistakes are
// errUsage (exit 2), list flags are not split at commas (--set
// redis.addrs=a:1,b:2 is one value), and a single-value flag given twice
// (--delay 1s --delay 2s) is a usage mistake, not a silent last-wins.
func strict(c *cli.Command) {
	c.OnUsageError = func(_ context.Context, cmd *cli.Command, err error, _ bool) error {
		return usageErr(cmd, "%v", err)
	}
	c.DisableSliceFlagSeparator = true
	for _, f := range c.Flags {
		switch f := f.(type) {
		case *cli.StringFlag:
			f.OnlyOnce = true
		case *cli.DurationFlag:
			f.OnlyOnce = true
		case *cli.IntFlag:
			f.OnlyOnce = true
		case *cli.BoolFlag:
			f.OnlyOnce = true
		}
	}
	for _, sub := range c.Commands {
		strict(sub)
	}
}

// usageErr is a command-line mistake, pointing at the command's help.
func usageErr(cmd *cli.Command, format string, args ...any) error {
	return fmt.Errorf("%w: %s (see %s --help)", errUsage, fmt.Sprintf(format, args...), cmd.FullName())
}

// noArgs refuses positional arguments.
func noArgs(cmd *cli.Command) error {
	if cmd.Args().Present() {
		return usageErr(cmd, "unexpected argument %q", cmd.Args().First())
	}
	return nil
}

func buildVersion() string {
	if version != "0.2.0-dev" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return version
}

// versionLine is what `delayd version` prints: the version, and from the
// build info the commit (with "+dirty" for a modified tree) and the Go
// version, so a `go build` or `go install` binary identifies itself.
func versionLine() string {
	line := "delayd " + buildVersion()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return line
	}
	commit, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if commit != "" {
		if len(commit) > 12 {
			commit = commit[:12]
		}
		if dirty {
			commit += "+dirty"
		}
		line += " commit " + commit
	}
	return line + " " + bi.GoVersion
}

// loggedErr is an error the daemon's logger already wrote (as JSON with
// log.json): main exits 1 without printing it again.
type loggedErr struct{ err error }

func (e *loggedErr) Error() string { return e.err.Error() }
func (e *loggedErr) Unwrap() error { return e.err }

// exitCode prints err and maps it to a process status: 0 ok, 2 usage,
// 1 anything else (a failure, or an id that is not stored).
func exitCode(err error, stderr io.Writer) int {
	var logged *loggedErr
	switch {
	case err == nil:
		return 0
	case errors.As(err, &logged):
		return 1
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "delayd:", err)
		return 2
	}
	fmt.Fprintln(stderr, "delayd:", err)
	return 1
}

// Config flags: each sets one config key, overriding the file and the
// environment only when given. A command takes the ones it uses.
const (
	flagNATSURL    = "nats-url"
	flagRedisAddrs = "redis-addrs"
	flagLogLevel   = "log-level"
	flagSubject    = "subject"
	flagEmbedded   = "embedded"
	flagLogJSON    = "log-json"
)

var configFlagKeys = map[string]string{
	flagNATSURL: "nats.url", flagRedisAddrs: "redis.addrs", flagLogLevel: "log.level", flagSubject: "subject",
	flagEmbedded: "embedded", flagLogJSON: "log.json",
}

// configFlags returns --config, --set and the named config flags.
func configFlags(names ...string) []cli.Flag {
	fs := []cli.Flag{
		&cli.StringFlag{Name: "config", TakesFile: true, Usage: "YAML config file (env DELAYD_CONFIG)"},
		&cli.StringSliceFlag{Name: "set", Usage: "set any config key, e.g. --set scanner.lease=5s (repeatable)"},
	}
	for _, n := range names {
		key := configFlagKeys[n]
		usage := fmt.Sprintf("sets %s (env %s)", key, config.EnvName(key))
		switch n {
		case flagEmbedded:
			fs = append(fs, &cli.BoolFlag{Name: n, Usage: "start an in-process NATS server and Redis emulation (nothing durable); " + usage})
		case flagLogJSON:
			fs = append(fs, &cli.BoolFlag{Name: n, Usage: "log as JSON lines; " + usage})
		default:
			fs = append(fs, &cli.StringFlag{Name: n, Usage: usage})
		}
	}
	return fs
}

// connFlags are the flags of a command that talks to the service over
// NATS: where and how to connect, and how long to wait.
func connFlags(timeout time.Duration) []cli.Flag {
	return append(configFlags(flagNATSURL, flagSubject),
		&cli.DurationFlag{Name: "timeout", Value: timeout, Usage: "how long to wait for the reply"})
}

func jsonFlag(usage string) cli.Flag { return &cli.BoolFlag{Name: "json", Usage: usage} }

// loadConfig layers the config file, the environment and the config flags
// the command was given.
func loadConfig(cmd *cli.Command, getenv func(string) string) (config.Config, error) {
	src, err := configSources(cmd, getenv)
	if err != nil {
		return config.Config{}, err
	}
	c, err := config.Load(src)
	if err != nil {
		return c, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

// configSources gathers the layers of the command's configuration: the
// file, the environment and the flags given.
func configSources(cmd *cli.Command, getenv func(string) string) (config.Sources, error) {
	set := map[string]string{}
	for flag, key := range configFlagKeys {
		if !cmd.IsSet(flag) {
			continue
		}
		switch flag {
		case flagEmbedded, flagLogJSON:
			set[key] = strconv.FormatBool(cmd.Bool(flag))
		default:
			set[key] = cmd.String(flag)
		}
	}
	for _, kv := range cmd.StringSlice("set") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return config.Sources{}, usageErr(cmd, "--set wants key=value, got %q", kv)
		}
		set[k] = v
	}
	path := cmd.String("config")
	if path == "" {
		path = getenv("DELAYD_CONFIG")
	}
	return config.Sources{Path: path, Getenv: getenv, Environ: environ(), Flags: set}, nil
}

func newLogger(c config.Config, w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       "delayd",
		Level:      hclog.LevelFromString(c.Log.Level),
		JSONFormat: c.Log.JSON,
		Output:     w,
	})
}
