package main

import (
	"context"
	"fmt"
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
				out, err := act(c, ctx, r)
				if err != nil {
					return err
				}
				if cmd.Bool("json") {
					return printJSON(o.stdout, out)
				}
				fmt.Fprintf(o.stdout, "%s %d dead envelope(s)\n", pastTense[verb], out.Count)
				if out.More {
					fmt.Fprintln(o.stdout, "more remain: run it again")
				}
				return nil
			})
		},
	}
}
