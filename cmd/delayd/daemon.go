package main

import (
	"context"
	"os"
	"runtime/pprof"

	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
)

func runCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "run the daemon (the default command)",
		Flags: append(configFlags(flagNATSURL, flagRedisAddrs, flagSubject, flagLogLevel, flagEmbedded, flagLogJSON),
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile to this file until shutdown", TakesFile: true}),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if cmd.Args().Present() {
				// "delayd bogus" lands here too, as run is the default.
				return usageErr(cmd.Root(), "unknown command or argument %q", cmd.Args().First())
			}
			if p := cmd.String("cpuprofile"); p != "" {
				f, err := os.Create(p)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			c, err := loadConfig(cmd, o.getenv)
			if err != nil {
				// A refusal is logged as the daemon logs, so that with
				// log.json a log pipeline parses it too.
				if src, serr := configSources(cmd, o.getenv); serr == nil && config.WantsJSONLog(src) {
					c := config.Default()
					c.Log.JSON = true
					newLogger(c, o.stderr).Error("delayd refused its configuration", "error", err)
					return &loggedErr{err}
				}
				return err
			}
			log := newLogger(c, o.stderr)
			if err := daemon.New(c, log, daemon.WithVersion(buildVersion())).Run(ctx); err != nil {
				// Through the logger, so that with log.json the last
				// line is JSON too; main then prints nothing more.
				log.Error("delayd stopped", "error", err)
				return &loggedErr{err}
			}
			return nil
		},
	}
}
