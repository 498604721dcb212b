package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/config"
)

// headerFlags collects repeated -H Key:Value flags.
type headerFlags map[string][]string

func (h headerFlags) String() string { return "" }
func (h headerFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(k) == "" {
		return fmt.Errorf("want Key:Value, got %q", v)
	}
	k = strings.TrimSpace(k)
	h[k] = append(h[k], strings.TrimSpace(val))
	return nil
}

func scheduleCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("schedule", "schedule --target SUBJ (--delay D | --at T) [--id ID] [-H K:V]... [PAYLOAD|-]", stderr)
	cf := addConfigFlags(fs)
	var r bridge.ScheduleRequest
	hdr := headerFlags{}
	fs.StringVar(&r.Target, "target", "", "subject to deliver to (required)")
	fs.StringVar(&r.Delay, "delay", "", "deliver after this Go duration, e.g. 30m or 1500ms")
	fs.StringVar(&r.At, "at", "", "deliver at this RFC 3339 time, e.g. 2026-11-30T10:00:00.250Z")
	fs.StringVar(&r.ID, "id", "", "idempotency key; the same id again replaces the message")
	fs.Var(hdr, "H", "header Key:Value to deliver with the payload (repeatable)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the reply")
	if err := parse(fs, args); err != nil {
		return err
	}
	if r.Target == "" || (r.Delay == "") == (r.At == "") {
		fs.Usage()
		return fmt.Errorf("%w: --target and exactly one of --delay and --at are required", errUsage)
	}
	switch {
	case fs.NArg() > 1:
		return fmt.Errorf("%w: one payload argument at most (quote it)", errUsage)
	case fs.NArg() == 1 && fs.Arg(0) != "-":
		r.Payload = []byte(fs.Arg(0))
	default:
		b, err := io.ReadAll(stdin)
		if err != nil {
			return fmt.Errorf("read payload from stdin: %w", err)
		}
		r.Payload = b
	}
	r.Header = hdr
	return withClient(ctx, cf, getenv, *timeout, func(ctx context.Context, c *bridge.Client) error {
		reply, err := c.Schedule(ctx, r)
		if err != nil {
			return err
		}
		return printJSON(stdout, reply)
	})
}

func cancelCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("cancel", "cancel [flags] ID", stderr)
	cf := addConfigFlags(fs)
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the reply")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("%w: cancel takes exactly one ID", errUsage)
	}
	return withClient(ctx, cf, getenv, *timeout, func(ctx context.Context, c *bridge.Client) error {
		reply, err := c.Cancel(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		return printJSON(stdout, reply)
	})
}

// withClient runs f with a client connected per the config layers.
func withClient(ctx context.Context, cf *configFlags, getenv func(string) string, timeout time.Duration, f func(context.Context, *bridge.Client) error) error {
	c, err := cf.load(getenv)
	if err != nil {
		return err
	}
	auth, err := natsAuth(c)
	if err != nil {
		return err
	}
	cl, err := bridge.Dial(c.NATS.URL, c.Subject, auth, timeout)
	if err != nil {
		return fmt.Errorf("%w (set --nats-url or %s)", err, config.EnvName("nats.url"))
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return f(ctx, cl)
}

func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}
