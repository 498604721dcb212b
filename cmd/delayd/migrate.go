package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/store"
)

// migrateCommand moves the data of the retired stored formats 1 and 2
// (written by builds before 0.2.0) to format 3, and records the
// namespace's format, so that a daemon of this version starts on it
// (internal/store/schema.go).
func migrateCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name: "migrate",
		Usage: "move data of the retired stored formats 1, 2 and 4 (builds before 0.2.0) to format 3 " +
			"(reads and writes Redis directly; stop the daemons of older builds first, or restart them with redis.due_buckets off)",
		Flags: configFlags(flagRedisAddrs),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			return migrate(ctx, cmd, o)
		},
	}
}

func migrate(ctx context.Context, cmd *cli.Command, o cliIO) error {
	c, rdb, st, err := openStore(cmd, o)
	if err != nil {
		return err
	}
	defer st.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = rdb.Ping(pctx).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("migrate: cannot reach Redis at %s (redis.addrs): %w",
			config.RedactURL(strings.Join(c.Redis.Addrs, ",")), err)
	}
	moved, err := st.Migrate(ctx, func(shard int, l store.Legacy) {
		if l.Total() > 0 {
			fmt.Fprintf(o.stdout, "shard %d: %s moved\n", shard, l)
		}
	})
	if err != nil {
		return fmt.Errorf("migrate: %w (what was moved stays moved: run it again)", err)
	}
	fmt.Fprintf(o.stdout, "moved %s\nnamespace %q records stored format %d: daemons of this version start on it\n",
		moved, c.Namespace, store.FormatIntegerLeases)
	return nil
}
