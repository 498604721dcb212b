package main

import (
	"context"

	"github.com/urfave/cli/v3"
)

// configCommand prints the effective configuration after every layer,
// with passwords, tokens and URL credentials redacted, so it is safe to
// paste; the output loads again as a config file.
func configCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "print the effective configuration, secrets redacted",
		Flags: configFlags(flagNATSURL, flagRedisAddrs, flagSubject, flagLogLevel, flagEmbedded, flagLogJSON),
		Action: func(_ context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			c, err := loadConfig(cmd, o.getenv)
			if err != nil {
				return err
			}
			b, err := c.YAML()
			if err != nil {
				return err
			}
			_, err = o.stdout.Write(b)
			return err
		},
	}
}
