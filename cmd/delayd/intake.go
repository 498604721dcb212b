package main

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/bridge/intake"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
)

// intakeCommand manages the durable intake stream.
func intakeCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "intake",
		Usage: "manage the durable intake stream: migrate",
		Commands: []*cli.Command{
			{
				Name: "migrate",
				Usage: "move a work-queue intake stream (the layout before 0.2.0) to the limits layout while the daemons run; " +
					"safe to stop and run again",
				Flags: configFlags(flagNATSURL, flagSubject),
				Action: func(ctx context.Context, cmd *cli.Command) error {
					if err := noArgs(cmd); err != nil {
						return err
					}
					return migrateIntake(ctx, cmd, o)
				},
			},
		},
		Action: func(_ context.Context, cmd *cli.Command) error {
			if cmd.Args().Present() {
				return usageErr(cmd, "intake %q: want migrate", cmd.Args().First())
			}
			return usageErr(cmd, "intake needs migrate")
		},
	}
}

func migrateIntake(ctx context.Context, cmd *cli.Command, o cliIO) error {
	c, err := loadConfig(cmd, o.getenv)
	if err != nil {
		return err
	}
	auth, err := daemon.NATSAuth(c)
	if err != nil {
		return err
	}
	nc, err := bridge.Dial(c.NATS.URL, c.NATS.Name+"-migrate", auth, 5*time.Second)
	if err != nil {
		return fmt.Errorf("%w (set --nats-url or %s)", err, config.EnvName("nats.url"))
	}
	defer nc.Close()
	s := c.Intake.Stream
	return intake.MigrateIntake(ctx, nc, intake.StreamOptions{Options: intake.Options{Subject: c.Subject},
		Name: s.Name, Replicas: s.Replicas, WorkQueue: s.Retention == "workqueue", MaxAge: s.MaxAge, MaxBytes: s.MaxBytes}, newLogger(c, o.stderr).Named("migrate"))
}
