package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// healthcheckCmd exits 0 when this host's daemon answers /readyz with 200.
// It exists for the image's HEALTHCHECK: the distroless image has no
// shell or curl. The address comes from http.addr (config, env, --set) or
// --addr.
func healthcheckCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("healthcheck", "healthcheck [--addr HOST:PORT] [--path /readyz]", stderr)
	cf := addConfigFlags(fs)
	addr := fs.String("addr", "", "admin address to check (default: http.addr)")
	path := fs.String("path", "/readyz", "path that must answer 200 (/livez checks only that the process runs)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if *addr == "" {
		c, err := cf.load(getenv)
		if err != nil {
			return err
		}
		if c.HTTP.Addr == "" {
			return fmt.Errorf("healthcheck: http.addr is empty, the admin server is off")
		}
		*addr = c.HTTP.Addr
	}
	url := "http://" + dialable(*addr) + *path
	ctx, cancel := context.WithTimeout(ctx, *timeout)
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
