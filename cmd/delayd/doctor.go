package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/store"
)

// doctorReport is what `delayd doctor --json` prints.
type doctorReport struct {
	Shards      int                    `json:"shards"`
	Found       map[string]int         `json:"found"`
	ByShard     map[int]map[string]int `json:"by_shard,omitempty"`
	Repaired    bool                   `json:"repaired"`
	Persistence *store.Persistence     `json:"persistence,omitempty"`
	// Formats counts the stored values by format (1: before the value
	// header, 3: the header, which formats 2 to 4 share, higher: written
	// by a newer version).
	Formats map[int]int `json:"formats"`
	// Unreadable counts the values that are no envelope of any format
	// this version reads (corrupt, or not written by delayd).
	Unreadable int `json:"unreadable"`
	// Retired counts the data of the retired formats 1 and 2, which
	// delayd migrate moves.
	Retired store.Legacy `json:"retired"`
	// Schema is the namespace's record of the oldest format it may hold
	// (0: none yet).
	Schema int `json:"schema"`
}

// doctorCommand checks the delay set in Redis against the store's invariants:
// every stored envelope indexed exactly once (due, inflight or dead), no
// index entry without data. Read-only unless --repair. Safe while daemons
// deliver: every page is checked atomically.
func doctorCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check the data in Redis for consistency (reads Redis directly, not through the daemon)",
		Flags: append(configFlags(flagRedisAddrs),
			&cli.BoolFlag{Name: "repair", Usage: "fix what is found: unindexed data becomes due now, an id in several indexes keeps one, entries without data are dropped"},
			jsonFlag("print the report as JSON"),
			&cli.DurationFlag{Name: "pause", Usage: "wait between pages of 200 entries, to go easy on a busy Redis"}),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			return doctor(ctx, cmd, o)
		},
	}
}

func doctor(ctx context.Context, cmd *cli.Command, o cliIO) error {
	repair, asJSON, pause, stdout := cmd.Bool("repair"), cmd.Bool("json"), cmd.Duration("pause"), o.stdout
	c, rdb, st, err := openStore(cmd, o)
	if err != nil {
		return err
	}
	defer st.Close()
	rep := doctorReport{Shards: c.Shards, Found: map[string]int{}, ByShard: map[int]map[string]int{}, Repaired: repair}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = rdb.Ping(pctx).Err()
	if err == nil {
		if p, err := store.ReadPersistence(pctx, rdb); err == nil {
			rep.Persistence = &p
		}
	}
	cancel()
	if err != nil {
		// The addresses may be redis:// URLs with a password: named
		// redacted, as the daemon and `delayd config` do.
		return fmt.Errorf("doctor: cannot reach Redis at %s (redis.addrs): %w\n"+
			"  give the address of delayd's Redis with --redis-addrs HOST:PORT (or DELAYD_REDIS_ADDRS, or redis.addrs in --config);\n"+
			"  a daemon run with --embedded logs the doctor command for its Redis emulation at start",
			config.RedactURL(strings.Join(c.Redis.Addrs, ",")), err)
	}
	if rep.Formats, err = st.Formats(ctx); err != nil {
		return err
	}
	rep.Unreadable = rep.Formats[store.FormatUnreadable]
	delete(rep.Formats, store.FormatUnreadable)
	if rep.Retired, err = st.Legacy(ctx); err != nil {
		return err
	}
	if rep.Schema, err = st.Schema(ctx); err != nil {
		return err
	}
	// No repair beside a retired format, or a daemon that may write one:
	// ids of the due buckets would look unindexed, and be made due at once.
	repair = repair && rep.Retired.Total() == 0
	if repair {
		if err := st.RetiredWriterLive(ctx); err != nil {
			return fmt.Errorf("doctor: --repair refused, nothing changed: %w", err)
		}
	}
	rep.Repaired = repair
	for sh := range c.Shards {
		found, err := st.Check(ctx, sh, store.CheckOptions{Repair: repair, Pause: pause})
		if err != nil {
			return err
		}
		if len(found) > 0 {
			rep.ByShard[sh] = found
		}
		for k, n := range found {
			rep.Found[k] += n
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printDoctor(stdout, rep)
	}
	// The retired formats first: their lease scores are no tokens
	// (inflight_without_claim), which a repair does not move.
	if n := rep.Retired.Total(); n > 0 {
		return fmt.Errorf("%d entries of a retired stored format, nothing repaired: stop the daemons of older builds "+
			"(or restart them with redis.due_buckets off), then run delayd migrate", n)
	}
	if len(rep.Found) > 0 && !repair {
		return fmt.Errorf("%d kinds of inconsistency found; run delayd doctor --repair", len(rep.Found))
	}
	if rep.Unreadable > 0 {
		return fmt.Errorf("%d unreadable stored values: delete them by hand (delayd never delivers them)", rep.Unreadable)
	}
	return nil
}

func printDoctor(w io.Writer, rep doctorReport) {
	if p := rep.Persistence; p != nil {
		fmt.Fprintf(w, "redis: maxmemory-policy %s, appendonly %s, appendfsync %s\n", p.EvictionPolicy, p.AppendOnly, p.AppendFsync)
		fmt.Fprintf(w, "       loss window on a Redis crash: %s\n", p.LossWindow())
		if p.Evicts() {
			fmt.Fprintln(w, "       WARNING: this policy evicts keys and loses acknowledged envelopes; set noeviction")
		}
	}
	fmt.Fprintf(w, "checked %d shards\n", rep.Shards)
	formats := make([]int, 0, len(rep.Formats))
	for f := range rep.Formats {
		formats = append(formats, f)
	}
	slices.Sort(formats)
	for _, f := range formats {
		note := ""
		switch {
		case f == store.FormatBare:
			note = " (retired: written before the value header)"
		case f > store.FormatIntegerLeases:
			note = " (written by a newer version: this version leaves them alone)"
		}
		fmt.Fprintf(w, "stored format %d: %d values%s\n", f, rep.Formats[f], note)
	}
	if l := rep.Retired; l.Total() > 0 {
		fmt.Fprintf(w, "retired formats: %s\n", l)
		fmt.Fprintln(w, "  no daemon of this version starts on them: stop the daemons of older builds, then run delayd migrate")
	}
	if rep.Unreadable > 0 {
		fmt.Fprintf(w, "unreadable: %d values that are no envelope of any format (corrupt, or not written by delayd)\n", rep.Unreadable)
	}
	if len(rep.Found) == 0 {
		fmt.Fprintln(w, "consistent: every stored envelope is indexed exactly once, and every index entry has its data")
		return
	}
	verb := "found"
	if rep.Repaired {
		verb = "repaired"
	}
	for _, k := range store.Kinds(rep.Found) {
		fmt.Fprintf(w, "%-24s %8d %s\n", k, rep.Found[k], verb)
	}
}

// openStore is the store of the config that cmd's flags and environment
// give, for the commands that read Redis directly (doctor, migrate).
func openStore(cmd *cli.Command, o cliIO) (config.Config, redis.UniversalClient, *store.Store, error) {
	c, err := loadConfig(cmd, o.getenv)
	if err != nil {
		return c, nil, nil, err
	}
	ropts, err := daemon.RedisOptions(c)
	if err != nil {
		return c, nil, nil, err
	}
	// The Redis library's own log lines (one per failed dial) say less
	// than the errors of the commands.
	store.SetLogger(hclog.NewNullLogger())
	rdb := store.NewClient(ropts)
	return c, rdb, store.New(rdb, c.Namespace, c.Shards), nil
}
