package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/delayd/delayd/internal/bridge"
)

func getCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("get", "get [flags] ID", stderr)
	cf := addConfigFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the reply")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("%w: get takes exactly one ID", errUsage)
	}
	return withClient(ctx, cf, getenv, *timeout, func(ctx context.Context, c *bridge.Client) error {
		e, err := c.Get(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, e)
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "id\t%s\nstate\t%s\n%s\t%s\ntarget\t%s\nsize\t%d bytes\nattempts\t%d\nshard\t%d\n",
			e.ID, e.State, dueLabel(e.State), e.Due, e.Target, e.Size, e.Attempts, e.Shard)
		for k, vs := range e.Header {
			fmt.Fprintf(tw, "header\t%s: %s\n", k, strings.Join(vs, ", "))
		}
		return tw.Flush()
	})
}

func dueLabel(state string) string {
	switch state {
	case "inflight":
		return "lease until"
	case "dead":
		return "died"
	}
	return "due"
}

func listCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("list", "list [--target PATTERN] [--due-before T] [--limit N] [--cursor C] [--dead]", stderr)
	cf := addConfigFlags(fs)
	var r bridge.ListRequest
	fs.StringVar(&r.Target, "target", "", "only targets matching this subject pattern (filters each page)")
	fs.StringVar(&r.DueBefore, "due-before", "", "only envelopes due before this RFC 3339 time")
	fs.IntVar(&r.Limit, "limit", 100, "envelopes per page (at most 1000)")
	fs.StringVar(&r.Cursor, "cursor", "", "continue from the cursor a previous page printed")
	fs.BoolVar(&r.Dead, "dead", false, "list the dead set instead of pending envelopes")
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the reply")
	if err := parse(fs, args); err != nil {
		return err
	}
	return showPage(ctx, cf, getenv, *timeout, r, *asJSON, stdout)
}

// showPage fetches one page of pending or dead envelopes and prints it as
// JSON or as a table, with the cursor of the next page.
func showPage(ctx context.Context, cf *configFlags, getenv func(string) string, timeout time.Duration, r bridge.ListRequest, asJSON bool, stdout io.Writer) error {
	return withClient(ctx, cf, getenv, timeout, func(ctx context.Context, c *bridge.Client) error {
		page, err := c.List(ctx, r)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, page)
		}
		if r.Dead {
			return printPage(stdout, page, "ID\tDIED\tTARGET\tATTEMPTS\tERROR", func(e bridge.EntryInfo) string {
				return fmt.Sprintf("%s\t%s\t%s\t%d\t%s", e.ID, e.Due, e.Target, e.Attempts, e.Error)
			})
		}
		return printPage(stdout, page, "ID\tDUE\tTARGET\tSIZE\tATTEMPTS\tSHARD", func(e bridge.EntryInfo) string {
			return fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%d", e.ID, e.Due, e.Target, e.Size, e.Attempts, e.Shard)
		})
	})
}

func statsCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("stats", "stats [flags]", stderr)
	cf := addConfigFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the reply")
	if err := parse(fs, args); err != nil {
		return err
	}
	return withClient(ctx, cf, getenv, *timeout, func(ctx context.Context, c *bridge.Client) error {
		st, err := c.Stats(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, st)
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "SHARD\tPENDING\tINFLIGHT\tDEAD\tNEXT DUE\t")
		for _, s := range st.Shards {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t\n", s.Shard, s.Pending, s.Inflight, s.Dead, orDash(s.NextDue))
		}
		fmt.Fprintf(tw, "total\t%d\t%d\t%d\t%s\t\n", st.Pending, st.Inflight, st.Dead, orDash(st.NextDue))
		return tw.Flush()
	})
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printPage prints one page of entries as a table, then how to get the next.
func printPage(w io.Writer, page bridge.ListReply, header string, row func(bridge.EntryInfo) string) error {
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
