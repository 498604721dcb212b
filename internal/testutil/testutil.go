// Package testutil starts the real servers delayd's tests run against: a
// throwaway redis-server process on a free port and an in-process
// nats-server. No mocks: faults are injected by killing and restarting them.
package testutil

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/redis/go-redis/v9"
)

// Redis is a redis-server child process owned by one test.
type Redis struct {
	t    testing.TB
	Addr string
	dir  string
	args []string
	cmd  *exec.Cmd
	tls  *tls.Config // set when the server only speaks TLS
}

// RedisBinary finds redis-server, or skips the test; under CI=true a
// missing binary fails the test instead, so CI never passes vacuously.
func RedisBinary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server not found (CI=true): %v", err)
		}
		t.Skipf("redis-server not found: %v", err)
	}
	return p
}

// StartRedis starts redis-server on a free loopback port in a temp dir.
// extra are additional config directives, e.g. "appendonly", "yes".
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	return startRedis(t, nil, nil, extra...)
}

// StartRedisTLS starts redis-server speaking only TLS, requiring client
// certificates signed by the certs' CA.
func StartRedisTLS(t testing.TB, c Certs, extra ...string) *Redis {
	t.Helper()
	return startRedis(t, &c, c.ClientTLS(t), extra...)
}

func startRedis(t testing.TB, certs *Certs, clientTLS *tls.Config, extra ...string) *Redis {
	t.Helper()
	bin := RedisBinary(t)
	r := &Redis{t: t, dir: t.TempDir(), tls: clientTLS}
	if slices.Contains(extra, "--cluster-enabled") {
		r.Addr = fmt.Sprintf("127.0.0.1:%d", clusterPort(t))
	} else {
		r.Addr = fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	}
	_, port, _ := net.SplitHostPort(r.Addr)
	listen := []string{"--port", port}
	if certs != nil {
		listen = []string{"--port", "0", "--tls-port", port, "--tls-cert-file", certs.ServerCert,
			"--tls-key-file", certs.ServerKey, "--tls-ca-cert-file", certs.CA, "--tls-auth-clients", "yes"}
	}
	r.args = append(append(listen, "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", ""), extra...)
	r.args = append([]string{bin}, r.args...)
	r.Start()
	t.Cleanup(r.Kill)
	return r
}

// Start (re)starts the process with the same port, dir and settings.
func (r *Redis) Start() {
	r.t.Helper()
	r.cmd = exec.Command(r.args[0], r.args[1:]...)
	r.cmd.Dir = r.dir
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, TLSConfig: r.tls})
	defer c.Close()
	// LOADING errors mean the AOF is being replayed: keep waiting.
	if !Eventually(10*time.Second, func() bool { return c.Ping(context.Background()).Err() == nil }) {
		r.t.Fatalf("redis-server on %s did not become ready", r.Addr)
	}
}

// Kill stops the process with SIGKILL, losing anything not yet on disk.
func (r *Redis) Kill() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
}

// Pause stops the process with SIGSTOP: connections stay open and requests
// are taken by the kernel, but nothing is answered until Resume.
func (r *Redis) Pause() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused process with SIGCONT.
func (r *Redis) Resume() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Client returns a go-redis client for direct inspection in tests.
func (r *Redis) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr, TLSConfig: r.tls})
	r.t.Cleanup(func() { c.Close() })
	return c
}

// NATS is an in-process nats-server owned by one test.
type NATS struct {
	t    testing.TB
	Opts *server.Options
	Srv  *server.Server
}

// StartNATS starts nats-server in-process on a free port with JetStream
// stored in a temp dir. NATS_LOG=1 shows the server's log.
func StartNATS(t testing.TB, opts ...func(*server.Options)) *NATS {
	t.Helper()
	n := newNATS(t)
	for _, o := range opts {
		o(n.Opts)
	}
	n.Start()
	t.Cleanup(n.Stop)
	return n
}

func newNATS(t testing.TB) *NATS {
	return &NATS{t: t, Opts: &server.Options{
		Host: "127.0.0.1", Port: FreePort(t), NoLog: os.Getenv("NATS_LOG") == "", NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), MaxPayload: 8 << 20,
	}}
}

// URL is the client URL of the server.
func (n *NATS) URL() string { return fmt.Sprintf("nats://%s:%d", n.Opts.Host, n.Opts.Port) }

// Start (re)starts the server on the same port.
func (n *NATS) Start() {
	n.t.Helper()
	s, err := server.NewServer(n.Opts)
	if err != nil {
		n.t.Fatalf("nats-server: %v", err)
	}
	if !n.Opts.NoLog {
		s.ConfigureLogger()
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		n.t.Fatal("nats-server not ready")
	}
	n.Srv = s
}

// Stop shuts the server down.
func (n *NATS) Stop() {
	if n.Srv != nil {
		n.Srv.Shutdown()
		n.Srv.WaitForShutdown()
		n.Srv = nil
	}
}

// handedOut are the ports FreePort gave this process: a server stopped
// for a fault test is started again on its port, and while it is down the
// kernel may offer that port to another test's FreePort, whose server
// would then take it (two cmd/delayd tests failed "nats-server not ready"
// in one CI run). No port is handed out twice.
var handedOut sync.Map

// ephemeralRange is the kernel's range of ports for :0 listeners and the
// local ends of outgoing connections.
func ephemeralRange() (lo, hi int, ok bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, false
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	return lo, hi, err1 == nil && err2 == nil && lo <= hi
}

// FreePort returns a free loopback TCP port that no test of this process
// has been given before, taken below the kernel's ephemeral range where
// there is room: a port in that range, free when asked, may be given by the
// kernel to another process's :0 listener or to the local end of any
// outgoing connection before the test's server binds it (or while a fault
// test has it stopped), and the server then fails "address already in
// use". Below the range only another FreePort (of a test binary running
// beside this one) can take it: the start is random, so that is rare.
func FreePort(t testing.TB) int {
	t.Helper()
	if lo, _, ok := ephemeralRange(); ok && lo > lowPorts+1024 {
		span := lo - lowPorts
		start := rand.IntN(span)
		for i := range span {
			port := lowPorts + (start+i)%span
			if _, taken := handedOut.LoadOrStore(port, true); taken {
				continue
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				continue // in use: never handed out
			}
			l.Close()
			return port
		}
	}
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if _, taken := handedOut.LoadOrStore(port, true); !taken {
			return port
		}
	}
	t.Fatal("free port: the kernel kept offering ports handed out already")
	return 0
}

// clusterPort is FreePort for a Redis Cluster node, which also listens on
// its port + 10000 (the cluster bus): that one must be free too, never
// handed out to another server, and below the ephemeral range as well (a
// CI run had a node fail to start, "did not become ready", on port 25170).
func clusterPort(t testing.TB) int {
	t.Helper()
	lo, _, ok := ephemeralRange()
	if !ok {
		lo = 65536
	}
	for range 1000 {
		p := FreePort(t)
		bus := p + 10000
		if bus >= lo || bus > 65535 {
			continue
		}
		if _, taken := handedOut.LoadOrStore(bus, true); taken {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", bus))
		if err != nil {
			continue
		}
		l.Close()
		return p
	}
	t.Fatal("no free port whose cluster bus port (+10000) is free too")
	return 0
}

// lowPorts is the lowest port FreePort gives below the ephemeral range,
// above the well-known and most registered ones.
const lowPorts = 10000

// BuildBinary builds ./cmd/delayd into a temp dir, for tests that need a
// real process to kill -9.
func BuildBinary(t testing.TB) string {
	t.Helper()
	root := moduleRoot(t)
	out := filepath.Join(t.TempDir(), "delayd")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/delayd")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

func moduleRoot(t testing.TB) string {
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found")
		}
		dir = parent
	}
}

// ExternalRedis is a Redis started outside the test (for example under a
// profiler) at addr; Start, Kill and the like must not be called on it.
func ExternalRedis(t testing.TB, addr string) *Redis {
	return &Redis{t: t, Addr: addr}
}
