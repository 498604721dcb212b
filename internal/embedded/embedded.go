// Package embedded starts the in-process servers of `delayd run --embedded`:
// a nats-server and a Redis emulation (miniredis) that runs the same Lua
// scripts. Nothing is durable in this mode; it exists for trying delayd
// without installing anything.
package embedded

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/delayd/delayd/internal/config"
)

// Servers are the running embedded servers.
type Servers struct {
	NATS      *server.Server
	Redis     *miniredis.Miniredis
	RedisAddr string
	dir       string // JetStream's store
}

// Start starts nats-server on the host:port of natsURL and miniredis on a
// free loopback port.
func Start(natsURL string) (*Servers, error) {
	// The errors name the URL without its credentials, and not url.Parse's
	// error, which quotes it whole.
	u, err := url.Parse(natsURL)
	if err != nil {
		return nil, fmt.Errorf("embedded: nats.url %s does not parse", config.RedactURL(natsURL))
	}
	host, portStr, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("embedded: nats.url %s needs host:port: %w", config.RedactURL(natsURL), err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("embedded: nats.url port %q: %w", portStr, err)
	}
	// JetStream, for the durable stream intake, in a temp dir removed at
	// Stop: nothing is durable in this mode.
	dir, err := os.MkdirTemp("", "delayd-embedded-js-")
	if err != nil {
		return nil, fmt.Errorf("embedded: jetstream dir: %w", err)
	}
	ns, err := server.NewServer(&server.Options{Host: host, Port: port, NoSigs: true, NoLog: true,
		JetStream: true, StoreDir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded: nats-server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(5 * time.Second) {
		ns.Shutdown()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded: nats-server did not start on %s:%d (port in use?)", host, port)
	}
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		ns.Shutdown()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded: redis emulation: %w", err)
	}
	return &Servers{NATS: ns, Redis: mr, RedisAddr: mr.Addr(), dir: dir}, nil
}

// Stop shuts both servers down.
func (s *Servers) Stop() {
	s.Redis.Close()
	s.NATS.Shutdown()
	s.NATS.WaitForShutdown()
	os.RemoveAll(s.dir)
}
