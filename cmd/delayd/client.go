package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
)

// parseHeaders turns repeated -H Key:Value flags into key, value pairs.
func parseHeaders(cmd *cli.Command, vs []string) ([][2]string, error) {
	var h [][2]string
	for _, v := range vs {
		k, val, ok := strings.Cut(v, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, usageErr(cmd, "-H wants Key:Value, got %q", v)
		}
		h = append(h, [2]string{strings.TrimSpace(k), strings.TrimSpace(val)})
	}
	return h, nil
}

func scheduleCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:      "schedule",
		Usage:     "schedule a message; the payload is PAYLOAD, or stdin when omitted or -",
		ArgsUsage: "[PAYLOAD|-]",
		Flags: append(connFlags(5*time.Second),
			&cli.StringFlag{Name: "target", Usage: "subject to deliver to (required)"},
			&cli.StringFlag{Name: "delay", Usage: "deliver after this Go duration, e.g. 30m or 1500ms"},
			&cli.StringFlag{Name: "at", Usage: "deliver at this RFC 3339 time, e.g. 2026-11-30T10:00:00.250Z"},
			&cli.StringFlag{Name: "every", Usage: "deliver repeatedly, every Go duration, e.g. 1h"},
			&cli.StringFlag{Name: "cron", Usage: `deliver repeatedly at the times of a 6-field cron spec, seconds first, e.g. "0 0 9 * * MON-FRI", or @hourly, @daily...`},
			&cli.StringFlag{Name: "tz", Usage: "IANA time zone the --cron spec is read in, e.g. Europe/Paris (default UTC)"},
			&cli.StringFlag{Name: "start", Usage: "with --every or --cron: no delivery before this RFC 3339 time; for --every also its phase (default: --every starts one period from now, --cron at its next time)"},
			&cli.StringFlag{Name: "until", Usage: "with --every or --cron: no delivery due after this RFC 3339 time (inclusive)"},
			&cli.IntFlag{Name: "count", Usage: "with --every or --cron: stop after this many deliveries"},
			&cli.StringFlag{Name: "catch-up", Usage: "with --every or --cron: after delayd was down past several times, \"one\" (default) delivers one late occurrence and goes on from now, \"all\" delivers every missed one"},
			&cli.StringFlag{Name: "jitter", Usage: "deliver at a moment in [due, due + this Go duration), e.g. 2s; for a repeat, each occurrence its own"},
			&cli.StringFlag{Name: "id", Usage: "idempotency key; the same id again replaces the message"},
			&cli.StringSliceFlag{Name: "H", Usage: "header Key:Value to deliver with the payload (repeatable)"},
		),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			target := cmd.String("target")
			when := 0
			for _, f := range []string{"delay", "at", "every", "cron"} {
				if cmd.String(f) != "" {
					when++
				}
			}
			if target == "" || when != 1 {
				return usageErr(cmd, "--target and exactly one of --delay, --at, --every and --cron are required")
			}
			opts, err := scheduleOptions(cmd)
			if err != nil {
				return err
			}
			var payload []byte
			switch args := cmd.Args(); {
			case args.Len() > 1:
				return usageErr(cmd, "one payload argument at most (quote it)")
			case args.Len() == 1 && args.First() != "-":
				payload = []byte(args.First())
			default:
				if payload, err = io.ReadAll(stdin); err != nil {
					return fmt.Errorf("read payload from stdin: %w", err)
				}
			}
			return withClient(ctx, cmd, o.getenv, func(ctx context.Context, c *client.Client) error {
				reply, err := c.Schedule(ctx, target, payload, opts...)
				if err != nil {
					return err
				}
				return printJSON(o.stdout, reply)
			})
		},
	}
}

// scheduleOptions turns the schedule flags into client options; a value
// that does not parse is a usage error.
func scheduleOptions(cmd *cli.Command) ([]client.ScheduleOption, error) {
	var opts []client.ScheduleOption
	durations := map[string]func(time.Duration) client.ScheduleOption{"delay": client.Delay, "every": client.Every, "jitter": client.Jitter}
	times := map[string]func(time.Time) client.ScheduleOption{"at": client.At, "start": client.Start, "until": client.Until}
	for _, f := range []string{"delay", "every", "jitter"} {
		if v := cmd.String(f); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				return nil, usageErr(cmd, "--%s wants a Go duration such as 30m or 1500ms, got %q", f, v)
			}
			opts = append(opts, durations[f](d))
		}
	}
	for _, f := range []string{"at", "start", "until"} {
		if v := cmd.String(f); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return nil, usageErr(cmd, "--%s wants an RFC 3339 time such as 2026-11-30T10:00:00Z, got %q", f, v)
			}
			opts = append(opts, times[f](t))
		}
	}
	if v := cmd.String("cron"); v != "" {
		opts = append(opts, client.Cron(v))
	}
	if v := cmd.String("tz"); v != "" {
		opts = append(opts, client.TimeZone(v))
	}
	if cmd.IsSet("count") {
		opts = append(opts, client.Count(int(cmd.Int("count"))))
	}
	switch v := cmd.String("catch-up"); v {
	case "", "one":
	case "all":
		opts = append(opts, client.CatchUpAll())
	default:
		return nil, usageErr(cmd, "--catch-up takes \"one\" or \"all\", got %q", v)
	}
	if v := cmd.String("id"); v != "" {
		opts = append(opts, client.ID(v))
	}
	h, err := parseHeaders(cmd, cmd.StringSlice("H"))
	if err != nil {
		return nil, err
	}
	for _, kv := range h {
		opts = append(opts, client.Header(kv[0], kv[1]))
	}
	return opts, nil
}

func cancelCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:      "cancel",
		Usage:     "cancel a scheduled message; exit status 1 when no message has the id",
		ArgsUsage: "ID",
		Flags:     connFlags(5 * time.Second),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			id, err := oneID(cmd)
			if err != nil {
				return err
			}
			return withClient(ctx, cmd, o.getenv, func(ctx context.Context, c *client.Client) error {
				reply, err := c.Cancel(ctx, id)
				if err != nil {
					return err
				}
				if err := printJSON(o.stdout, reply); err != nil {
					return err
				}
				if !reply.Cancelled {
					// Like get: a missing id is a failure for a script.
					return fmt.Errorf("cancel: no envelope with id %q (%w)", id, errNotFound)
				}
				return nil
			})
		},
	}
}

// oneID returns the single ID argument of a command.
func oneID(cmd *cli.Command) (string, error) {
	if cmd.Args().Len() != 1 {
		return "", usageErr(cmd, "%s takes exactly one ID", cmd.Name)
	}
	return cmd.Args().First(), nil
}

// withClient runs f with a client connected per the config layers, under
// the command's --timeout.
func withClient(ctx context.Context, cmd *cli.Command, getenv func(string) string, f func(context.Context, *client.Client) error) error {
	c, err := loadConfig(cmd, getenv)
	if err != nil {
		return err
	}
	auth, err := daemon.NATSAuth(c)
	if err != nil {
		return err
	}
	timeout := cmd.Duration("timeout")
	nc, err := bridge.Dial(c.NATS.URL, "delayd-cli", auth, timeout)
	if err != nil {
		return fmt.Errorf("%w (set --nats-url or %s)", err, config.EnvName("nats.url"))
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return f(ctx, client.New(nc, client.Prefix(c.Subject)))
}

func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}
