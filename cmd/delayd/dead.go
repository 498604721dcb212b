package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/client"
)

var pastTense = map[string]string{"replay": "replayed", "purge": "purged"}

// deadCommand manages the dead set: envelopes whose delivery kept failing.
func deadCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "dead",
		Usage: "manage envelopes whose delivery kept failing: list, replay, purge",
		Commands: []*cli.Command{
			{
				Name:  "list",
				Usage: "list dead envelopes by time of death, a page at a time",
				Flags: append(connFlags(30*time.Second), listFlags()...),
				Action: func(ctx context.Context, cmd *cli.Command) error {
					if err := noArgs(cmd); err != nil {
						return err
					}
					return showPage(ctx, cmd, o, client.ListRequest{Dead: true})
				},
			},
			deadActCommand(o, "replay", "schedule dead envelopes again, due now", (*client.Client).Replay),
			deadActCommand(o, "purge", "delete dead envelopes", (*client.Client).Purge),
		},
		Action: func(_ context.Context, cmd *cli.Command) error {
			if cmd.Args().Present() {
				return usageErr(cmd, "dead %q: want list, replay or purge", cmd.Args().First())
			}
			return usageErr(cmd, "dead needs list, replay or purge")
		},
	}
}

// deadAct is Replay or Purge.
type deadAct func(*client.Client, context.Context, client.DeadSelection) (client.DeadResult, error)

func deadActCommand(o cliIO, verb, usage string, act deadAct) *cli.Command {
	return &cli.Command{
		Name:      verb,
		Usage:     usage,
		ArgsUsage: "(ID... | --all)",
		Flags: append(connFlags(30*time.Second), jsonFlag("print JSON"),
			&cli.BoolFlag{Name: "all", Usage: "every dead envelope"}),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			r := client.DeadSelection{IDs: cmd.Args().Slice(), All: cmd.Bool("all")}
			if (len(r.IDs) == 0) == !r.All {
				return usageErr(cmd, "%s takes IDs or --all", verb)
			}
			return withClient(ctx, cmd, o.getenv, func(ctx context.Context, c *client.Client) error {
				// Named ids that are not dead (unknown, or pending) are
				// found first, so that the failure below can name them.
				notDead, err := notDeadIDs(ctx, c, r.IDs)
				if err != nil {
					return err
				}
				out, err := act(c, ctx, r)
				if err != nil {
					return err
				}
				if cmd.Bool("json") {
					if err := printJSON(o.stdout, out); err != nil {
						return err
					}
				} else {
					fmt.Fprintf(o.stdout, "%s %d dead envelope(s)\n", pastTense[verb], out.Count)
					if out.More {
						fmt.Fprintln(o.stdout, "more remain: run it again")
					}
				}
				if !r.All && out.Count < len(slices.Compact(slices.Sorted(slices.Values(r.IDs)))) {
					if len(notDead) == 0 { // it was dead a moment ago
						return fmt.Errorf("dead %s: %d of the ids given not found among the dead envelopes", verb, len(r.IDs)-out.Count)
					}
					return fmt.Errorf("dead %s: not found among the dead envelopes: %s", verb, strings.Join(notDead, ", "))
				}
				return nil
			})
		},
	}
}

// notDeadIDs returns the ids that are not dead envelopes: not stored, or
// stored but pending or in flight.
func notDeadIDs(ctx context.Context, c *client.Client, ids []string) ([]string, error) {
	var out []string
	for _, id := range slices.Compact(slices.Sorted(slices.Values(ids))) {
		e, err := c.Get(ctx, id)
		switch {
		case errors.Is(err, client.ErrNotFound):
			out = append(out, id)
		case err != nil:
			return nil, err
		case e.State != "dead":
			out = append(out, id+" ("+e.State+")")
		}
	}
	return out, nil
}
