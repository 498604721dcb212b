package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/client"
)

// maxListLimit is the largest page the service returns.
const maxListLimit = 1000

func getCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:      "get",
		Usage:     "show where a scheduled message is; exit status 1 when no message has the id",
		ArgsUsage: "ID",
		Flags:     append(connFlags(5*time.Second), jsonFlag("print JSON")),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			id, err := oneID(cmd)
			if err != nil {
				return err
			}
			return withClient(ctx, cmd, o.getenv, func(ctx context.Context, c *client.Client) error {
				e, err := c.Get(ctx, id)
				if err != nil {
					return err
				}
				if cmd.Bool("json") {
					return printJSON(o.stdout, e)
				}
				tw := tabwriter.NewWriter(o.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintf(tw, "id\t%s\nstate\t%s\n%s\t%s\ntarget\t%s\nsize\t%d bytes\nattempts\t%d\nshard\t%d\n",
					e.ID, e.State, dueLabel(e.State), fixedTime(e.Due), e.Target, e.Size, e.Attempts, e.Shard)
				if e.Series != "" {
					fmt.Fprintf(tw, "series\t%s\noccurrence\t%d\n", e.Series, e.Occurrence)
				}
				for k, vs := range e.Header {
					fmt.Fprintf(tw, "header\t%s: %s\n", k, strings.Join(vs, ", "))
				}
				return tw.Flush()
			})
		},
	}
}

func dueLabel(state string) string {
	switch state {
	case "inflight":
		return "lease until"
	case "dead":
		return "died"
	case "paused":
		return "due (paused)"
	}
	return "due"
}

// fixedTime rewrites an RFC 3339 time with exactly three fraction digits
// in UTC, so that times line up in columns (the service drops trailing
// zeros). Anything unparsable is returned as it is.
func fixedTime(s string) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return s
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

func listFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "limit", Value: 100, Usage: fmt.Sprintf("envelopes per page, 1..%d", maxListLimit)},
		&cli.StringFlag{Name: "cursor", Usage: "continue from the cursor a previous page printed"},
		jsonFlag("print JSON"),
	}
}

func listCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "list",
		Usage: "list scheduled (or --dead) messages in due order, a page at a time",
		Flags: append(append(connFlags(5*time.Second), listFlags()...),
			&cli.StringFlag{Name: "target", Usage: "only targets matching this subject pattern (filters each page)"},
			&cli.StringFlag{Name: "due-before", Usage: "only envelopes due before this RFC 3339 time"},
			&cli.BoolFlag{Name: "dead", Usage: "list the dead set instead of pending envelopes"},
		),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			r := client.ListRequest{Target: cmd.String("target"), DueBefore: cmd.String("due-before"), Dead: cmd.Bool("dead")}
			return showPage(ctx, cmd, o, r)
		},
	}
}

// showPage fetches one page of pending or dead envelopes and prints it as
// JSON or as a table, with the cursor of the next page if there is one.
func showPage(ctx context.Context, cmd *cli.Command, o cliIO, r client.ListRequest) error {
	r.Limit, r.Cursor = int(cmd.Int("limit")), cmd.String("cursor")
	if r.Limit < 1 || r.Limit > maxListLimit {
		return usageErr(cmd, "--limit must be 1..%d, got %d", maxListLimit, r.Limit)
	}
	return withClient(ctx, cmd, o.getenv, func(ctx context.Context, c *client.Client) error {
		page, err := c.List(ctx, r)
		if err != nil {
			return err
		}
		if cmd.Bool("json") {
			return printJSON(o.stdout, page)
		}
		if r.Dead {
			return printPage(o.stdout, page, "ID\tDIED\tTARGET\tATTEMPTS\tERROR", func(e client.Entry) string {
				return fmt.Sprintf("%s\t%s\t%s\t%d\t%s", e.ID, fixedTime(e.Due), e.Target, e.Attempts, e.Error)
			})
		}
		// STATE: pending, or paused (held by a pause; listed last).
		return printPage(o.stdout, page, "ID\tDUE\tSTATE\tTARGET\tSIZE\tATTEMPTS\tSHARD", func(e client.Entry) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%d\t%d", e.ID, fixedTime(e.Due), e.State, e.Target, e.Size, e.Attempts, e.Shard)
		})
	})
}

func statsCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "stats",
		Usage: "pending, inflight and dead counts per shard",
		Flags: append(connFlags(5*time.Second), jsonFlag("print JSON")),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			return withClient(ctx, cmd, o.getenv, func(ctx context.Context, c *client.Client) error {
				st, err := c.Stats(ctx)
				if err != nil {
					return err
				}
				if cmd.Bool("json") {
					return printJSON(o.stdout, st)
				}
				tw := tabwriter.NewWriter(o.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
				fmt.Fprintln(tw, "SHARD\tPENDING\tINFLIGHT\tDEAD\tNEXT DUE\t")
				for _, s := range st.Shards {
					fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t\n", s.Shard, s.Pending, s.Inflight, s.Dead, orDash(s.NextDue))
				}
				fmt.Fprintf(tw, "total\t%d\t%d\t%d\t%s\t\n", st.Pending, st.Inflight, st.Dead, orDash(st.NextDue))
				if err := tw.Flush(); err != nil || len(st.Flow) == 0 {
					return err
				}
				fmt.Fprintln(o.stdout, "\nflow control (pending counts what it holds):")
				return printRules(o.stdout, st.Flow)
			})
		},
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return fixedTime(s)
}

// printPage prints one page of entries as a table, then how to get the
// next; the last page has no next.
func printPage(w io.Writer, page client.Page, header string, row func(client.Entry) string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, e := range page.Entries {
		fmt.Fprintln(tw, row(e))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(w, "more: --cursor %s\n", page.Next)
	}
	return nil
}
