package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/config"
)

// parseHeaders turns repeated -H Key:Value flags into a header.
func parseHeaders(cmd *cli.Command, vs []string) (map[string][]string, error) {
	h := map[string][]string{}
	for _, v := range vs {
		k, val, ok := strings.Cut(v, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, usageErr(cmd, "-H wants Key:Value, got %q", v)
		}
		k = strings.TrimSpace(k)
		h[k] = append(h[k], strings.TrimSpace(val))
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
			&cli.StringFlag{Name: "id", Usage: "idempotency key; the same id again replaces the message"},
			&cli.StringSliceFlag{Name: "H", Usage: "header Key:Value to deliver with the payload (repeatable)"},
		),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			r := bridge.ScheduleRequest{Target: cmd.String("target"), Delay: cmd.String("delay"), At: cmd.String("at"), ID: cmd.String("id")}
			if r.Target == "" || (r.Delay == "") == (r.At == "") {
				return usageErr(cmd, "--target and exactly one of --delay and --at are required")
			}
			var err error
			if r.Header, err = parseHeaders(cmd, cmd.StringSlice("H")); err != nil {
				return err
			}
			switch args := cmd.Args(); {
			case args.Len() > 1:
				return usageErr(cmd, "one payload argument at most (quote it)")
			case args.Len() == 1 && args.First() != "-":
				r.Payload = []byte(args.First())
			default:
				b, err := io.ReadAll(stdin)
				if err != nil {
					return fmt.Errorf("read payload from stdin: %w", err)
				}
				r.Payload = b
			}
			return withClient(ctx, cmd, o.getenv, func(ctx context.Context, c *bridge.Client) error {
				reply, err := c.Schedule(ctx, r)
				if err != nil {
					return err
				}
				return printJSON(o.stdout, reply)
			})
		},
	}
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
			return withClient(ctx, cmd, o.getenv, func(ctx context.Context, c *bridge.Client) error {
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
func withClient(ctx context.Context, cmd *cli.Command, getenv func(string) string, f func(context.Context, *bridge.Client) error) error {
	c, err := loadConfig(cmd, getenv)
	if err != nil {
		return err
	}
	auth, err := natsAuth(c)
	if err != nil {
		return err
	}
	timeout := cmd.Duration("timeout")
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
