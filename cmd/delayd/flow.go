package main

// The flow-control commands: limit, limits, pause, resume
// (docs/operations.md, "Flow control").

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/client"
)

// flowTimeout is the default --timeout of a change: a resume releases its
// envelopes a thousand a round trip.
const flowTimeout = 30 * time.Second

func limitCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "limit",
		Usage: "rate-limit deliveries to targets matching PATTERN, fleet-wide: delayd limit 'orders.>' 500/s [--burst 50]; delayd limit PATTERN off removes it",
		Description: "RATE is N/s, N/m or N/h. Envelopes of matching targets go out in due order at no more than\n" +
			"the rate (after a burst of --burst at once), never early; one held back stays pending and is\n" +
			"not an attempt. The limit is kept in Redis: every daemon obeys one budget, and it survives\n" +
			"restarts. A target obeys the most specific limit that matches it. 'off' removes the limit\n" +
			"and makes what it held due now. The change is answered once every live daemon holds it.",
		ArgsUsage: "PATTERN RATE|off",
		Flags: append(connFlags(flowTimeout), jsonFlag("print JSON"),
			&cli.IntFlag{Name: "burst", Usage: "deliveries that may go at once before the rate applies (default 1)"}),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() != 2 {
				return usageErr(cmd, "want PATTERN and RATE (such as 500/s) or off")
			}
			pattern, rate := cmd.Args().Get(0), cmd.Args().Get(1)
			if rate == "off" && cmd.IsSet("burst") {
				return usageErr(cmd, "--burst goes with a rate, not with off")
			}
			if cmd.IsSet("burst") && cmd.Int("burst") < 1 {
				return usageErr(cmd, "--burst must be 1 or more, got %d", cmd.Int("burst"))
			}
			return withClient(ctx, cmd, o.getenv, func(ctx context.Context, c *client.Client) error {
				var ch client.FlowChange
				var err error
				if rate == "off" {
					ch, err = c.RemoveLimit(ctx, pattern)
				} else {
					ch, err = c.SetLimit(ctx, pattern, rate, int(cmd.Int("burst")))
				}
				if err != nil {
					return err
				}
				if cmd.Bool("json") {
					return printJSON(o.stdout, ch)
				}
				switch {
				case rate != "off":
					fmt.Fprintf(o.stdout, "limited %s to %s, burst %d\n", pattern, ch.Rule.Rate, ch.Rule.Burst)
				case ch.Existed:
					fmt.Fprintf(o.stdout, "removed the limit on %s; %d held envelopes are due now\n", pattern, ch.Released)
				default:
					fmt.Fprintf(o.stdout, "%s had no limit\n", pattern)
				}
				return nil
			})
		},
	}
}

func limitsCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "limits",
		Usage: "list the fleet's rate limits and pauses, and what they hold back",
		Flags: append(connFlags(5*time.Second), jsonFlag("print JSON")),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			return withClient(ctx, cmd, o.getenv, func(ctx context.Context, c *client.Client) error {
				rules, err := c.Limits(ctx)
				if err != nil {
					return err
				}
				if cmd.Bool("json") {
					return printJSON(o.stdout, rules)
				}
				return printRules(o.stdout, rules)
			})
		},
	}
}

// printRules prints the flow-control rules as a table.
func printRules(w io.Writer, rules []client.FlowRule) error {
	if len(rules) == 0 {
		_, err := fmt.Fprintln(w, "no limits or pauses")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PATTERN\tLIMIT\tBURST\tPAUSED SINCE\tHELD (LIMIT)\tPARKED (PAUSE)\tDRAINS IN\tRATE NOW")
	for _, r := range rules {
		limit, burst, drain, now := "-", "-", "-", "-"
		if r.Rate != "" {
			limit, burst = r.Rate, strconv.Itoa(r.Burst)
			drain = (time.Duration(r.DrainSeconds*1000) * time.Millisecond).String()
			now = fmt.Sprintf("%d/s", r.CurrentRate)
		}
		if r.PausedSince != "" && r.Parked > 0 {
			drain = "paused"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.Pattern, limit, burst, orDash(r.PausedSince), r.Limited, r.Parked, drain, now)
	}
	return tw.Flush()
}

// pauseCommand is pause, or resume.
func pauseCommand(o cliIO, resume bool) *cli.Command {
	c := &cli.Command{
		Name:  "pause",
		Usage: "hold every delivery to targets matching PATTERN, fleet-wide, until delayd resume PATTERN",
		Description: "The envelopes stay pending, cancellable and visible (state paused); none is delivered and\n" +
			"none spends an attempt. The pause is kept in Redis: it survives restarts. The change is\n" +
			"answered once every live daemon holds it.",
		ArgsUsage: "PATTERN",
		Flags:     append(connFlags(flowTimeout), jsonFlag("print JSON")),
	}
	if resume {
		c.Name = "resume"
		c.Usage = "end the pause of PATTERN: what it held goes out now, in due order, under any limit"
		c.Description = "Each envelope keeps the attempt it had."
	}
	c.Action = func(ctx context.Context, cmd *cli.Command) error {
		if cmd.Args().Len() != 1 {
			return usageErr(cmd, "want one PATTERN, such as 'orders.>'")
		}
		pattern := cmd.Args().First()
		return withClient(ctx, cmd, o.getenv, func(ctx context.Context, cl *client.Client) error {
			var ch client.FlowChange
			var err error
			if resume {
				ch, err = cl.Resume(ctx, pattern)
			} else {
				ch, err = cl.Pause(ctx, pattern)
			}
			if err != nil {
				return err
			}
			if cmd.Bool("json") {
				return printJSON(o.stdout, ch)
			}
			switch {
			case !resume:
				fmt.Fprintf(o.stdout, "paused %s since %s\n", pattern, fixedTime(ch.Rule.PausedSince))
			case ch.Existed || ch.Released > 0:
				fmt.Fprintf(o.stdout, "resumed %s; %d envelopes it held are due now\n", pattern, ch.Released)
			default:
				fmt.Fprintf(o.stdout, "%s was not paused\n", pattern)
			}
			return nil
		})
	}
	return c
}
