package bench

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
)

// childEnv makes this test binary the bench's child instead of running
// the tests: "exit" exits at once with status 3 (a child whose port is
// taken), "daemon" runs a real delayd from "run" arguments as the bench
// gives them (see fakeRun).
const childEnv = "DELAYD_BENCH_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "exit":
		os.Exit(3)
	case "daemon":
		if err := fakeRun(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "fake delayd run:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeRun is `delayd run` for the arguments childArgs makes: the flags
// become config keys, as the command line does, and the daemon runs until
// SIGTERM. It is the real daemon (internal/daemon), without the command
// line that lives in package main.
func fakeRun(args []string) error {
	if len(args) == 0 || args[0] != "run" {
		return fmt.Errorf("want run, got %q", args)
	}
	set := map[string]string{}
	path := ""
	for i := 1; i < len(args); i++ {
		next := func() string { i++; return args[i] }
		switch args[i] {
		case "--nats-url":
			set["nats.url"] = next()
		case "--redis-addrs":
			set["redis.addrs"] = next()
		case "--log-level":
			set["log.level"] = next()
		case "--embedded":
			set["embedded"] = "true"
		case "--config":
			path = next()
		case "--cpuprofile":
			next()
		case "--set":
			k, v, _ := strings.Cut(next(), "=")
			set[k] = v
		default:
			return fmt.Errorf("unknown argument %q", args[i])
		}
	}
	c, err := config.Load(config.Sources{Path: path, Flags: set})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return daemon.New(c, hclog.NewNullLogger()).Run(ctx)
}
