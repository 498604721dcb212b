package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/delayd/delayd/internal/bridge"
)

const deadUsage = `dead list [--limit N] [--cursor C] [--json]
       delayd dead replay (ID... | --all)
       delayd dead purge (ID... | --all)`

var pastTense = map[string]string{"replay": "replayed", "purge": "purged"}

// deadCmd manages the dead set: envelopes whose delivery kept failing.
func deadCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintf(stderr, "Usage: delayd %s\n", deadUsage)
		if len(args) == 0 {
			return fmt.Errorf("%w: dead needs list, replay or purge", errUsage)
		}
		return nil
	}
	verb, args := args[0], args[1:]
	fs := newFlags("dead "+verb, deadUsage, stderr)
	cf := addConfigFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the reply")
	switch verb {
	case "list":
		var r bridge.ListRequest
		fs.IntVar(&r.Limit, "limit", 100, "envelopes per page (at most 1000)")
		fs.StringVar(&r.Cursor, "cursor", "", "continue from the cursor a previous page printed")
		if err := parse(fs, args); err != nil {
			return err
		}
		r.Dead = true
		return showPage(ctx, cf, getenv, *timeout, r, *asJSON, stdout)
	case "replay", "purge":
		var r bridge.DeadRequest
		fs.BoolVar(&r.All, "all", false, "every dead envelope")
		if err := parse(fs, args); err != nil {
			return err
		}
		r.IDs = fs.Args()
		if (len(r.IDs) == 0) == !r.All {
			fs.Usage()
			return fmt.Errorf("%w: %s takes IDs or --all", errUsage, verb)
		}
		return withClient(ctx, cf, getenv, *timeout, func(ctx context.Context, c *bridge.Client) error {
			out, err := c.Dead(ctx, verb, r)
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(stdout, out)
			}
			fmt.Fprintf(stdout, "%s %d dead envelope(s)\n", pastTense[verb], out.Count)
			if out.More {
				fmt.Fprintln(stdout, "more remain: run it again")
			}
			return nil
		})
	}
	return fmt.Errorf("%w: dead %q: want list, replay or purge", errUsage, verb)
}
