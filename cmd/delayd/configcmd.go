package main

import (
	"context"
	"fmt"
	"io"
)

// configCmd prints the effective configuration after every layer, with
// passwords, tokens and URL credentials redacted, so it is safe to paste.
func configCmd(_ context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("config", "config [flags]", stderr)
	cf := addConfigFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	c, err := cf.load(getenv)
	if err != nil {
		return err
	}
	b, err := c.YAML()
	if err != nil {
		return err
	}
	_, err = stdout.Write(b)
	return err
}
