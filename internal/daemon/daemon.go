// Package daemon builds delayd's components from a config and runs them:
// the store and its guard, the NATS connections, the publisher, scanner,
// wake relay, intakes, shard ownership, checker and the admin servers.
// cmd/delayd only parses the command line and calls it, so tests can start
// a daemon in their own process.
package daemon

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/admin"
	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/bridge/delivery"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/embedded"
	"github.com/delayd/delayd/internal/flow"
	"github.com/delayd/delayd/internal/scanner"
	"github.com/delayd/delayd/internal/store"
)

// Daemon is one delayd. Run builds its parts and runs them.
type Daemon struct {
	c   config.Config
	log hclog.Logger
	opt options
}

// New returns a daemon for c (already validated) that logs to log.
// Nothing is built or connected before Run.
func New(c config.Config, log hclog.Logger, opts ...Option) *Daemon {
	d := &Daemon{c: c, log: log, opt: options{version: defaultVersion}}
	for _, f := range opts {
		f(&d.opt)
	}
	return d
}

// Run runs delayd until ctx is cancelled, then shuts down in order: stop
// intake (answering every request already taken), let the scanner finish
// the batches it is delivering, then drain NATS and close Redis.
func (d *Daemon) Run(ctx context.Context) error {
	log := d.log
	log.Info("starting", "version", d.opt.version, "shards", d.c.Shards, "namespace", d.c.Namespace)
	setMemoryLimit(log)
	p := &parts{c: d.c, log: log, opt: d.opt, metrics: admin.NewMetrics(d.opt.version, d.c.Mode)}
	defer p.close()
	if err := p.build(ctx); err != nil {
		return err
	}
	comps, err := p.components()
	if err != nil {
		return err
	}
	err = runOrdered(ctx, comps, p.c.Shutdown.Timeout, log)
	log.Info("stopped")
	return err
}

// parts are what one Run builds, in the order it builds them.
type parts struct {
	c       config.Config
	log     hclog.Logger
	opt     options
	metrics *admin.Metrics
	closers []func() // run last to first when Run returns

	rdb     redis.UniversalClient
	guard   *store.Guard // nil in embedded mode
	st      *store.Store
	auth    bridge.Auth
	in, out *nats.Conn // the request intake's connection, and the one for deliveries and wake-ups
	pub     *delivery.Publisher
	relay   *bridge.WakeRelay
	sc      *scanner.Scanner
	insp    inspector
	id      string
	own     *scanner.Ownership
	gate    *flow.Gate
	flow    *flow.Control
}

// build connects to Redis and NATS and builds the parts every mode has.
func (p *parts) build(ctx context.Context) error {
	if err := p.startEmbedded(); err != nil {
		return err
	}
	p.log.Info("roles", "mode", p.c.Mode)
	if err := p.newStore(ctx); err != nil {
		return err
	}
	if err := p.newNATS(); err != nil {
		return err
	}
	p.newScanner()
	return nil
}

func (p *parts) onClose(f func()) { p.closers = append(p.closers, f) }

func (p *parts) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

// startEmbedded starts embedded mode's in-process NATS server and Redis
// emulation, and points the config at the emulation.
func (p *parts) startEmbedded() error {
	if !p.c.Embedded {
		return nil
	}
	srv, err := embedded.Start(p.c.NATS.URL)
	if err != nil {
		return err
	}
	p.onClose(srv.Stop)
	p.c.Redis.Addrs = []string{srv.RedisAddr}
	p.log.Warn("EMBEDDED MODE: in-process NATS and Redis emulation; NOTHING IS DURABLE, every scheduled message is lost when delayd stops",
		"nats", config.RedactURL(p.c.NATS.URL), "redis", srv.RedisAddr)
	// The emulation listens on a port of its own choosing: the one way
	// for an operator to find it is this line.
	p.log.Info("check the stored data with", "command", doctorCommand(p.c))
	return nil
}

// daemonID names this daemon in the member set and as a shard's owner:
// the NATS name, the host, so an operator sees where a shard is scanned,
// and a unique suffix.
func daemonID(name string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return name + "@" + host + "-" + nuid.Next()
}

// doctorCommand is the delayd doctor command line that checks the data of
// the daemon configured by c.
func doctorCommand(c config.Config) string {
	cmd := "delayd doctor --redis-addrs " + strings.Join(c.Redis.Addrs, ",")
	d := config.Default()
	if c.Shards != d.Shards {
		cmd += fmt.Sprintf(" --set shards=%d", c.Shards)
	}
	if c.Namespace != d.Namespace {
		cmd += " --set namespace=" + c.Namespace
	}
	return cmd
}
