package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/urfave/cli/v3"
)

// healthcheckCmd exits 0 when this host's daemon answers /readyz with 200.
// It exists for the image's HEALTHCHECK: the distroless image has no
// shell or curl. The address comes from http.addr (config, env, --set) or
// --addr.
func healthcheckCommand(o cliIO) *cli.Command {
	return &cli.Command{
		Name:  "healthcheck",
		Usage: "exit 0 when this host's daemon answers /readyz with 200 (for the image's HEALTHCHECK)",
		Flags: append(configFlags(),
			&cli.StringFlag{Name: "addr", Usage: "admin address to check (default: http.addr)"},
			&cli.StringFlag{Name: "path", Value: "/readyz", Usage: "path that must answer 200 (/livez checks only that the process runs)"},
			&cli.DurationFlag{Name: "timeout", Value: 3 * time.Second, Usage: "how long to wait for the answer"}),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			return healthcheck(ctx, cmd, o)
		},
	}
}

func healthcheck(ctx context.Context, cmd *cli.Command, o cliIO) error {
	addr, path, timeout, stdout := cmd.String("addr"), cmd.String("path"), cmd.Duration("timeout"), o.stdout
	if addr == "" {
		c, err := loadConfig(cmd, o.getenv)
		if err != nil {
			return err
		}
		if c.HTTP.Addr == "" {
			return fmt.Errorf("healthcheck: http.addr is empty, the admin server is off")
		}
		addr = c.HTTP.Addr
	}
	url := "http://" + dialable(addr) + path
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s: %s: %s", url, resp.Status, body)
	}
	fmt.Fprintf(stdout, "%s: %s\n", url, resp.Status)
	return nil
}

// dialable turns a listen address into one to connect to: ":9479" and
// "0.0.0.0:9479" listen everywhere, so ask the loopback interface.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}
